#include "output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace allocscope {

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
    const std::string stem = path_ + ".tmp" + std::to_string(getpid()) + ".";
    int fd = -1;
    for (int n = 0; n < 1000 && fd < 0; ++n) {
        tmp_ = stem + std::to_string(n);
        fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        const int err = errno;
        tmp_.clear();
        fail(err);
    }
    stream_ = ::fdopen(fd, "wb");
    if (!stream_) {
        const int err = errno;
        ::close(fd);
        ::unlink(tmp_.c_str());
        tmp_.clear();
        fail(err);
    }
}

OutputFile::~OutputFile() {
    if (stream_) std::fclose(stream_);
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputFile::fail(int error) {
    throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(error));
}

void OutputFile::commit() {
    std::FILE* f = stream_;
    stream_ = nullptr;
    const bool bad = std::ferror(f) != 0;
    int err = bad ? EIO : 0;
    if (std::fflush(f) != 0 && !err) err = errno;
    if (std::fclose(f) != 0 && !err) err = errno;
    if (!err && ::rename(tmp_.c_str(), path_.c_str()) != 0) err = errno;
    if (err) fail(err);  // the destructor removes the temporary file
    tmp_.clear();
}

void write_file_atomically(const std::string& path, std::string_view text) {
    OutputFile out(path);
    if (!text.empty() && std::fwrite(text.data(), 1, text.size(), out.stream()) != text.size()) {
        throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
    }
    out.commit();
}

bool make_private_dirs(const std::string& path, std::string& error) {
    if (path.empty()) {
        error = "empty output directory path";
        return false;
    }
    size_t pos = 0;
    while (pos != std::string::npos) {
        pos = path.find('/', pos + 1);
        const std::string partial = path.substr(0, pos);
        if (partial.empty()) continue;
        if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
            error = "cannot create output directory " + partial + ": " + std::strerror(errno);
            return false;
        }
    }
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        error = "output path " + path + " is not a directory";
        return false;
    }
    return true;
}

}  // namespace allocscope
