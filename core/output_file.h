// Files the tools write into directories they do not own (a shared output
// directory, a report's -o path). Nothing is ever written through an
// existing name: the text goes into a fresh sibling created with
// O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600, and is renamed over the target
// once complete. A symlink or file planted at the target is replaced, never
// followed or truncated, and a reader never sees half a file.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace allocscope {

class OutputFile {
  public:
    // Creates the temporary sibling "<path>.tmp<pid>.<n>". Throws
    // std::runtime_error "cannot write <path>: <reason>".
    explicit OutputFile(std::string path);
    ~OutputFile();  // removes the temporary file unless committed
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    // A stdio stream on the temporary file (owned by this object).
    std::FILE* stream() noexcept { return stream_; }
    const std::string& path() const noexcept { return path_; }
    // Flushes, closes and renames the temporary file to `path`. Throws like
    // the constructor.
    void commit();

  private:
    [[noreturn]] void fail(int error);

    std::string path_;
    std::string tmp_;
    std::FILE* stream_ = nullptr;
};

// `text` into `path` through an OutputFile. Throws std::runtime_error.
void write_file_atomically(const std::string& path, std::string_view text);

// mkdir -p where every directory it creates has mode 0700 (an existing one
// is left as it is). Returns false with `error` naming the directory and the
// reason.
bool make_private_dirs(const std::string& path, std::string& error);

}  // namespace allocscope
