// The C++ plugin SDK in one include: every header of allocscope/sdk/, each
// one concern, on the C ABI of allocscope/plugin_v2.h. Header-only; each
// plugin is its own shared module, so nothing here is shared at run time.
// A plugin may include only the headers it uses:
//   adapter.h         a C++ class as a plugin (ALLOCSCOPE_DEFINE_PLUGIN)
//   finding.h         Finding, emit(), capped_evidence()
//   evidence.h        Evidence (one allocation proving a finding)
//   evidence_watch.h  HeldAlloc, EvidenceWatch (evidence followed until emitted)
//   options.h         option_bytes(), option_number(), option_count()
//   level_filter.h    block or segment level (option_level(), LevelFilter)
//   tag_tracker.h     per-thread tag stacks (TagTracker)
//   tag_rules.h       base_phase(), phase_within(), layer_within(), module paths
//   interner.h        Interner (dense ids for tag strings)
//   flat_map.h        FlatMap (open-addressing map for per-event state)
//   format.h          format_bytes(), format_signed_bytes()
//   size_set.h        SizeSet (sizes as the caching allocator reports them)
//   weight_sizes.h    weight_derived_sizes() (quantized weights' allocations)
//   weight_params.h   WeightParams (registered parameters matched by size)
#pragma once

#include <allocscope/plugin_v2.h>
#include <allocscope/sdk/adapter.h>
#include <allocscope/sdk/evidence.h>
#include <allocscope/sdk/evidence_watch.h>
#include <allocscope/sdk/finding.h>
#include <allocscope/sdk/flat_map.h>
#include <allocscope/sdk/format.h>
#include <allocscope/sdk/interner.h>
#include <allocscope/sdk/level_filter.h>
#include <allocscope/sdk/options.h>
#include <allocscope/sdk/size_set.h>
#include <allocscope/sdk/tag_rules.h>
#include <allocscope/sdk/tag_tracker.h>
#include <allocscope/sdk/weight_params.h>
#include <allocscope/sdk/weight_sizes.h>
