// The CLI's argument parser (args.h).
#include "args.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

#include "cli.h"

namespace allocscope::cli {

Args& Args::value(std::vector<std::string> names, Take take) {
    options_.push_back(Option{std::move(names), true, std::move(take), {}});
    return *this;
}

Args& Args::value(std::vector<std::string> names, std::string& out) {
    return value(std::move(names), [&out](const std::string& v) {
        out = v;
        return std::string();
    });
}

Args& Args::flag(std::vector<std::string> names, std::function<void()> set) {
    options_.push_back(Option{std::move(names), false, {}, std::move(set)});
    return *this;
}

Args& Args::flag(std::vector<std::string> names, bool& out, bool value) {
    return flag(std::move(names), [&out, value] { out = value; });
}

const Args::Option* Args::find(const std::string& name) const {
    for (const Option& o : options_) {
        for (const std::string& n : o.names) {
            if (n == name) return &o;
        }
    }
    return nullptr;
}

std::string Args::see_help() const {
    return "see allocscope " + command_ + " --help";
}

std::optional<int> Args::parse(const std::vector<std::string>& args) {
    positionals_.clear();
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "--") {
            positionals_.insert(positionals_.end(), args.begin() + static_cast<long>(i) + 1,
                                args.end());
            return std::nullopt;
        }
        if (a.size() < 2 || a[0] != '-') {
            if (stop_at_positional_) {
                positionals_.insert(positionals_.end(), args.begin() + static_cast<long>(i),
                                    args.end());
                return std::nullopt;
            }
            positionals_.push_back(a);
            continue;
        }
        if (a == "--help" || a == "-h") {
            std::fputs(help_, stdout);
            return 0;
        }
        // --name=value; a short option ("-o") takes its value separately.
        const size_t eq = a.rfind("--", 0) == 0 ? a.find('=') : std::string::npos;
        const std::string name = eq == std::string::npos ? a : a.substr(0, eq);
        const Option* option = find(name);
        if (option == nullptr) {
            return fail("unknown option '" + name + "' for " + command_ + " (" + see_help() + ")");
        }
        if (!option->takes_value) {
            if (eq != std::string::npos) {
                return fail(name + " takes no value (" + see_help() + ")");
            }
            option->set();
            continue;
        }
        std::string v;
        if (eq != std::string::npos) {
            v = a.substr(eq + 1);
        } else if (i + 1 < args.size()) {
            v = args[++i];
        } else {
            return fail(name + " needs a value (" + see_help() + ")");
        }
        if (const std::string problem = option->take(v); !problem.empty()) return fail(problem);
    }
    return std::nullopt;
}

Args::Take non_negative(const std::string& name, long& out, long max) {
    return [name, &out, max](const std::string& v) {
        char* end = nullptr;
        errno = 0;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n < 0 || errno == ERANGE || n > max) {
            return name + " expects a non-negative integer" +
                   (max < std::numeric_limits<long>::max() ? " up to " + std::to_string(max)
                                                           : std::string()) +
                   ", got '" + v + "'";
        }
        out = n;
        return std::string();
    };
}

Args::Take non_negative(const std::string& name, size_t& out) {
    return [name, &out](const std::string& v) {
        long n = 0;
        const std::string problem = non_negative(name, n, std::numeric_limits<long>::max())(v);
        if (problem.empty()) out = static_cast<size_t>(n);
        return problem;
    };
}

Args::Take one_of(const std::string& name, std::vector<std::string> choices, std::string& out) {
    return [name, choices = std::move(choices), &out](const std::string& v) {
        for (const std::string& c : choices) {
            if (c == v) {
                out = v;
                return std::string();
            }
        }
        std::string list;
        for (size_t i = 0; i < choices.size(); ++i) {
            list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
        }
        return name + " expects " + list + ", got '" + v + "'";
    };
}

}  // namespace allocscope::cli
