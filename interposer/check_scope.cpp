// The recorder's side of scoped checks (allocscope_check_begin / _end): a
// check runs on the writer thread (checks.h); these calls start and end one
// from the program's thread.
#include <exception>
#include <string>

#include "recorder_internal.h"

namespace allocscope::recorder {

uint64_t check_begin(const char* plugins, const char* options, std::string& error) noexcept {
    try {
        ApiScope scope;
        if (!scope.active()) {
            error =
                "allocscope is not recording in this process (disabled, no output, or a "
                "forked child: see its earlier message)";
            return 0;
        }
        CheckSet::Settings settings;
        settings.rank = g->config.rank;
        settings.world_size = g->config.world_size > 0 ? g->config.world_size : 0;
        settings.plugin_dir = plugin_dir();
        return g->checks.begin(plugins ? plugins : "", options ? options : "", settings, error);
    } catch (const std::exception& e) {
        error = std::string("cannot start the check: ") + e.what();
    } catch (...) {
        error = "cannot start the check";
    }
    return 0;
}

bool check_end(uint64_t id, CheckSet::Outcome& out) noexcept {
    try {
        ApiScope scope;
        if (!scope.active()) {
            out.error = "allocscope is not recording in this process";
            return false;
        }
        // Every event this thread recorded so far lies before the end.
        return g->checks.end(id, g->ring.reserved(), out);
    } catch (const std::exception& e) {
        out.error = std::string("cannot end the check: ") + e.what();
    } catch (...) {
        out.error = "cannot end the check";
    }
    return false;
}

}  // namespace allocscope::recorder
