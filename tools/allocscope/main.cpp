#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli.h"

#ifndef ALLOCSCOPE_VERSION
#define ALLOCSCOPE_VERSION "0.0.0"
#endif

namespace {

constexpr const char* kUsage = R"(usage: allocscope <command> [options]

Allocation attribution for CUDA training runs.

commands:
  run [--out DIR] [--force] [--stack-depth N] [--plugins LIST] [--plugin-dir DIR]
      [--plugin-option NAME.KEY=VALUE] [--check] [--fail-on SEV] [--nvtx]
      [--no-python] [--no-provenance]
      [--provenance-steps SPEC] [--max-trace-size SIZE] [--per-host] -- CMD [ARGS...]
                    run CMD with the interposer preloaded, recording one trace
                    per process into DIR (default ./allocscope-out); detection
                    plugins run live and their findings go to DIR/findings.json;
                    exits with CMD's status (--check: 3 on findings, 4 when
                    not everything was checked)
  report PATH... [--format text|json|html] [--full] [-o FILE] [--rank R] [--top N]
         [--baseline RUN]
                    attribution report of traces (files or output
                    directories): per layer and phase, timeline, top
                    allocation sites with symbolized stacks, findings;
                    concise text unless --full, HTML with hovers and the
                    per-layer forward chart (--baseline overlays a run)
  diff BASE CAND [--forward-threshold B] [--backward-threshold B]
       [--rank R] [--format text|json] [-o FILE]
                    the reference test's comparison of two runs: per-layer
                    forward increments, post-backward deltas; exit 3 when a
                    threshold is exceeded
  export PATH... --format perfetto|collapsed|memory-viz|parquet [-o FILE|DIR]
         [--rank R] [--run NAME]
                    traces for other tools: Perfetto/Chrome trace JSON
                    (memory counters, phase slices, findings), collapsed
                    stacks at the peak for flame graphs, a PyTorch memory
                    snapshot for pytorch.org/memory_viz, Parquet tables of
                    many runs for SQL (through DuckDB's libduckdb.so)
  replay PATH... [--plugins LIST] [--plugin-dir DIR] [--plugin-option NAME.KEY=VALUE]
         [--baseline PATH] [-o FILE]
                    run detection plugins on recorded traces; exit 4 when a
                    plugin did not run
  check PATH [--fail-on info|warning|error] [--full]
                    exit 3 when a findings file holds a finding at or above
                    the severity (default error), 4 when not everything was
                    checked, 0 otherwise
  config [--markdown]
                    the ALLOCSCOPE_* variables as this environment sets them
                    (exit 2 when one would be ignored), or their table
                    (docs/ENVIRONMENT.md)

  options take their value as "--opt value" or "--opt=value"; 2 is the
  exit status of bad input everywhere
  allocscope <command> --help   shows the options of a command
  allocscope --version          prints the version

example:
  allocscope run -- python train.py && allocscope report allocscope-out
)";

}  // namespace

namespace allocscope::cli {

int fail(const std::string& message) {
    std::fprintf(stderr, "allocscope: %s\n", message.c_str());
    return kExitUsage;
}

std::string format_bytes(uint64_t bytes) {
    return human_bytes(bytes);
}

}  // namespace allocscope::cli

int main(int argc, char** argv) {
    using namespace allocscope::cli;
    if (argc < 2) {
        std::fputs(kUsage, stderr);
        return kExitUsage;
    }
    std::string command = argv[1];
    std::vector<std::string> args(argv + 2, argv + argc);
    if (command == "--help" || command == "-h" || command == "help") {
        std::fputs(kUsage, stdout);
        return 0;
    }
    if (command == "--version") {
        std::printf("allocscope %s\n", ALLOCSCOPE_VERSION);
        return 0;
    }
    try {
        if (command == "run") return run_command(args);
        if (command == "report") return report_command(args);
        if (command == "replay") return replay_command(args);
        if (command == "diff") return diff_command(args);
        if (command == "export") return export_command(args);
        if (command == "check") return check_command(args);
        if (command == "config") return config_command(args);
    } catch (const std::exception& e) {
        return fail(e.what());
    }
    return fail("unknown command '" + command + "' (try: allocscope --help)");
}
