// A trace built event by event, for tests of the offline side (analysis,
// reports, exports, diff) where every number is known.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "event.h"
#include "trace_format.h"
#include "trace_writer.h"

namespace allocscope::test {

// A trace built event by event. Allocations take the tag on top of their
// thread's stack, as the interposer records them.
struct TraceBuilder {
    TraceHeader header;
    std::vector<std::string> strings{""};
    std::vector<std::vector<uint64_t>> stacks{{}};
    std::vector<ParamRecord> params;  // index = param index
    std::vector<Event> events;
    std::map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> tags;  // per tid
    uint64_t seq = 0, t_ns = 0;
    uint64_t current_step = 0;  // stamped on every event, as the interposer does

    TraceBuilder(int32_t rank = 0) {
        header.rank = rank;
        header.world_size = 2;
        header.pid = 4000 + uint32_t(rank + 1);
        header.start_wall_ns = 1'700'000'000'000'000'000ull;
    }

    uint32_t str(const std::string& s) {
        auto it = std::find(strings.begin(), strings.end(), s);
        if (it != strings.end()) return uint32_t(it - strings.begin());
        strings.push_back(s);
        return uint32_t(strings.size() - 1);
    }
    uint32_t stack(std::vector<uint64_t> frames) {
        stacks.push_back(std::move(frames));
        return uint32_t(stacks.size() - 1);
    }
    // A parameter (allocscope_register_param, without sizes): its index.
    uint32_t param(const std::string& layer, const std::string& name) {
        ParamRecord p;
        p.index = uint32_t(params.size());
        p.layer = str(layer);
        p.name = str(name);
        params.push_back(p);
        return p.index;
    }
    Event& add(EventKind kind, uint32_t tid) {
        Event e;
        e.seq = ++seq;
        e.t_ns = (t_ns += 1500);
        e.kind = kind;
        e.tid = tid;
        e.device = 0;
        e.step = current_step;
        const auto& s = tags[tid];
        if (!s.empty()) e.layer = s.back().first, e.phase = s.back().second;
        events.push_back(e);
        return events.back();
    }
    void push(const std::string& layer, const std::string& phase, uint32_t tid = 1) {
        tags[tid].emplace_back(str(layer), str(phase));
        add(EventKind::tag_push, tid).level = Level::none;
    }
    void pop(uint32_t tid = 1) {
        Event& e = add(EventKind::tag_pop, tid);
        if (!tags[tid].empty()) tags[tid].pop_back();
        (void)e;
    }
    void step(uint64_t n, uint32_t tid = 1) {
        current_step = n;
        add(EventKind::step, tid);
    }
    uint64_t segment(uint64_t address, uint64_t size, uint32_t stack_id = 0, uint32_t tid = 1,
                     MemoryKind memory = MemoryKind::device) {
        Event& e = add(EventKind::alloc, tid);
        e.level = Level::segment;
        e.memory = memory;
        e.api = memory == MemoryKind::host_pinned ? Api::cudaMallocHost : Api::cudaMalloc;
        e.address = address;
        e.size = size;
        e.stack = stack_id;
        return e.seq;
    }
    void segment_free(uint64_t address, uint32_t tid = 1) {
        Event& e = add(EventKind::free, tid);
        e.level = Level::segment;
        e.api = Api::cudaFree;
        e.address = address;
    }
    uint64_t block(uint64_t address, uint64_t size, uint32_t stack_id = 0, uint32_t tid = 1) {
        Event& e = add(EventKind::alloc, tid);
        e.level = Level::block;
        e.memory = MemoryKind::device;
        e.api = Api::block_alloc;
        e.address = address;
        e.size = size;
        e.stack = stack_id;
        e.stream = 7;
        return e.seq;
    }
    void block_free(uint64_t address, uint32_t tid = 1) {
        Event& e = add(EventKind::free, tid);
        e.level = Level::block;
        e.api = Api::block_free;
        e.address = address;
    }
    void oom(uint64_t size, uint32_t tid = 1) {
        Event& e = add(EventKind::oom, tid);
        e.level = Level::segment;
        e.memory = MemoryKind::device;
        e.api = Api::cudaMalloc;
        e.size = size;
        e.result = 2;
    }
    // The caching allocator gave up on a request (allocscope_block_oom).
    void block_oom(uint64_t size, uint64_t device_free = 0, uint32_t tid = 1) {
        Event& e = add(EventKind::oom, tid);
        e.level = Level::block;
        e.memory = MemoryKind::device;
        e.api = Api::block_alloc;
        e.size = size;
        e.address = device_free;
        e.result = 2;
    }

    std::string write(const std::filesystem::path& path) const {
        TraceWriter w;
        std::string error;
        REQUIRE_MESSAGE(w.open(path.string(), header, error), error);
        for (uint32_t i = 1; i < strings.size(); ++i)
            w.string(i, strings[i]);
        for (uint32_t i = 1; i < stacks.size(); ++i)
            w.stack(i, stacks[i]);
        for (const ParamRecord& p : params)
            w.param(p);
        for (const Event& e : events)
            w.event(e);
        FooterRecord footer;
        footer.events = events.size();
        footer.end_mono_ns = t_ns;
        w.close(footer);
        return path.string();
    }
};

}  // namespace allocscope::test
