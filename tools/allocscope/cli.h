// Subcommands of the allocscope CLI. Each returns the process exit status:
// 0 success, 2 usage or input error (one message on stderr), otherwise as
// documented per command.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace allocscope::cli {

inline constexpr int kExitUsage = 2;

int run_command(const std::vector<std::string>& args);
int report_command(const std::vector<std::string>& args);

// Prints "allocscope: <message>" on stderr and returns kExitUsage.
int fail(const std::string& message);

// "1.5 MiB" style sizes for humans.
std::string format_bytes(uint64_t bytes);

// The *.trace files directly in `dir`, sorted; empty if it cannot be read.
std::vector<std::string> trace_files_in(const std::string& dir);

}  // namespace allocscope::cli
