// A progress bar on stderr for long reports and exports, shown only when
// stderr is a terminal (never in logs or pipes).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace allocscope::cli {

// "[#####     ] what" on stderr, redrawn in place; cleared when done.
class Progress {
  public:
    Progress() : on_(isatty(STDERR_FILENO) != 0) {}
    ~Progress() { done(); }
    void show(const std::string& what, size_t done, size_t total) {
        if (!on_ || total == 0) return;
        const size_t filled = done * 30 / total;
        std::fprintf(stderr, "\r[%-30s] %s", std::string(filled, '#').c_str(), what.c_str());
        std::fflush(stderr);
        shown_ = true;
    }
    void done() {
        if (shown_) std::fprintf(stderr, "\r%*s\r", 80, "");
        shown_ = false;
    }

  private:
    bool on_;
    bool shown_ = false;
};

}  // namespace allocscope::cli
