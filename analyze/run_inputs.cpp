#include "run_inputs.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <system_error>

#include "findings_reader.h"

namespace allocscope {

namespace fs = std::filesystem;

TraceInputs expand_trace_paths(const std::vector<std::string>& paths) {
    TraceInputs in;
    std::set<std::string> findings;
    for (const std::string& p : paths) {
        std::error_code ec;
        if (fs::is_directory(p, ec)) {
            const std::vector<std::string> found = trace_files_in(p);
            if (found.empty()) throw std::runtime_error(p + ": no .trace files in this directory");
            in.traces.insert(in.traces.end(), found.begin(), found.end());
            for (const std::string& dir : trace_dirs_in(p)) {  // each host's, per-host
                const fs::path merged = fs::path(dir) / "findings.json";
                if (fs::exists(merged, ec)) {
                    findings.insert(merged.string());
                } else {
                    for (const std::string& f : rank_findings_files_in(dir))
                        findings.insert(f);
                }
            }
        } else if (fs::exists(p, ec)) {
            in.traces.push_back(p);
            const fs::path path(p);
            const fs::path mine =
                path.parent_path() / ("findings." + path.stem().string() + ".json");
            if (fs::exists(mine, ec)) findings.insert(mine.string());
        } else {
            throw std::runtime_error(p + ": no such file or directory");
        }
    }
    in.findings.assign(findings.begin(), findings.end());
    return in;
}

std::vector<std::string> rank_findings_files_in(const std::string& dir) {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.size() > 14 && name.rfind("findings.", 0) == 0 &&
            name.compare(name.size() - 5, 5, ".json") == 0) {
            files.push_back(entry.path().string());
        }
    }
    std::sort(files.begin(), files.end());
    return files;
}

FindingsFile merge_findings_files(const std::vector<std::string>& files) {
    std::vector<FindingsFile> loaded;
    for (const std::string& path : files)
        loaded.push_back(read_findings_file(path));
    return merge_findings(std::move(loaded));
}

std::vector<std::string> trace_dirs_in(const std::string& dir) {
    std::vector<std::string> dirs;
    std::error_code ec;
    bool own = false;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        if (entry.path().extension() == ".trace") own = true;
        if (entry.path().filename().string().rfind("host-", 0) == 0 && entry.is_directory(ec) &&
            !entry.is_symlink(ec)) {
            dirs.push_back(entry.path().string());
        }
    }
    if (own) return {dir};
    std::sort(dirs.begin(), dirs.end());
    return dirs;
}

std::vector<std::string> trace_files_in(const std::string& dir) {
    std::vector<std::string> files;
    std::error_code ec;
    for (const std::string& d : trace_dirs_in(dir)) {
        for (const auto& entry : std::filesystem::directory_iterator(d, ec)) {
            if (entry.path().extension() == ".trace") files.push_back(entry.path().string());
        }
    }
    std::sort(files.begin(), files.end());
    return files;
}

}  // namespace allocscope
