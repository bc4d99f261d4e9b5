// Work spread over the machine's cores: the traces of a run are analysed
// side by side (allocscope report, diff).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace allocscope {

// Calls work(i) once for each i in [0, n), on up to `threads` threads
// (0: one per hardware thread), and returns when every call has. Calls take
// the next index as they finish, so one slow item holds up nothing else;
// work must not throw (catch into the item's result).
template <class F>
void parallel_for(size_t n, F&& work, size_t threads = 0) {
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    threads = std::min(threads, n);
    std::atomic<size_t> next{0};
    auto run = [&] {
        for (size_t i; (i = next.fetch_add(1)) < n;)
            work(i);
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t)
        pool.emplace_back(run);
    if (n > 0) run();
    for (std::thread& t : pool)
        t.join();
}

// work(i) for each i in [0, n), side by side as parallel_for runs them; the
// results in index order. Where calls threw, the exception of the lowest
// index is rethrown once every call has returned, so what fails does not
// depend on the scheduling.
template <class F>
auto parallel_map(size_t n, F&& work, size_t threads = 0) {
    std::vector<decltype(work(size_t{0}))> results(n);
    std::vector<std::exception_ptr> errors(n);
    parallel_for(
        n,
        [&](size_t i) {
            try {
                results[i] = work(i);
            } catch (...) {
                errors[i] = std::current_exception();
            }
        },
        threads);
    for (const std::exception_ptr& e : errors) {
        if (e) std::rethrow_exception(e);
    }
    return results;
}

}  // namespace allocscope
