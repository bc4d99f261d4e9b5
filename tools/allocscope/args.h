// The one argument parser of the CLI's subcommands: options that take a
// value (`--name V` or `--name=V`), flags, positional arguments, `--help`
// and `-h`, and `--` (everything after it is positional). An argument that
// starts with '-' (other than "-" alone) is an option; an unknown one is an
// error naming the subcommand. Messages follow one pattern:
//   unknown option '--x' for report (see allocscope report --help)
//   --rank needs a value (see allocscope report --help)
//   <whatever the option's own check returns>
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace allocscope::cli {

class Args {
  public:
    // Checks and stores an option's value; returns "" when it is accepted,
    // else the whole message ("--format expects text or json, got 'pdf'").
    using Take = std::function<std::string(const std::string& value)>;

    Args(std::string command, const char* help) : command_(std::move(command)), help_(help) {}

    // An option with a value; `names` are its spellings ("-o", "--output").
    Args& value(std::vector<std::string> names, Take take);
    // An option with a value, stored as given.
    Args& value(std::vector<std::string> names, std::string& out);
    // An option without a value.
    Args& flag(std::vector<std::string> names, std::function<void()> set);
    Args& flag(std::vector<std::string> names, bool& out, bool value = true);
    // The first positional argument ends the options: it and everything
    // after it are the rest (`allocscope run [options] COMMAND ARGS...`).
    Args& stop_at_first_positional() {
        stop_at_positional_ = true;
        return *this;
    }

    // nullopt: go on with positionals(). Otherwise the exit status: 0 after
    // --help (printed on stdout), kExitUsage after one message on stderr.
    std::optional<int> parse(const std::vector<std::string>& args);

    const std::vector<std::string>& positionals() const { return positionals_; }

    // "see allocscope <command> --help", for the command's own messages.
    std::string see_help() const;

  private:
    struct Option {
        std::vector<std::string> names;
        bool takes_value = false;
        Take take;
        std::function<void()> set;
    };
    const Option* find(const std::string& name) const;

    std::string command_;
    const char* help_;
    std::vector<Option> options_;
    std::vector<std::string> positionals_;
    bool stop_at_positional_ = false;
};

// Value checks shared by the subcommands. Each returns "" or the message.
// A non-negative integer no larger than `max`, stored in `out`.
Args::Take non_negative(const std::string& name, long& out, long max);
Args::Take non_negative(const std::string& name, size_t& out);
// One of `choices`, stored in `out`: "--format expects text, json or html".
Args::Take one_of(const std::string& name, std::vector<std::string> choices, std::string& out);

}  // namespace allocscope::cli
