// The FSDP2-like training step (trainer.h): sharded parameters, all-gathers,
// FP8 quantization of the gathered weights, forward, backward,
// reduce-scatter and the optimizer, with every allocation in caching-
// allocator blocks tagged and declared as TransformerEngine and FSDP2 make
// them (docs/HARNESS.md). Longer than 600 lines: Trainer::State is one
// object whose methods are the step's stages in the order they run; split
// across files, one lifecycle would be read in pieces.
#include "trainer/trainer.h"

#include <allocscope/allocscope_dl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "fp8/columnwise.h"
#include "fp8/quantize.h"
#include "model/adam.h"
#include "model/transformer_layer.h"
#include "trainer/tagging.h"

namespace allocscope::harness::trainer {

namespace {

using model::Bf16;

// A block of the caching allocator, freed (and reported) when it goes.
class Block {
  public:
    Block() = default;
    Block(alloc::CachingAllocator& allocator, size_t bytes)
        : allocator_(&allocator), ptr_(allocator.allocate(bytes)), bytes_(bytes) {}
    Block(Block&& other) noexcept { *this = std::move(other); }
    Block& operator=(Block&& other) noexcept {
        if (this != &other) {
            reset();
            allocator_ = std::exchange(other.allocator_, nullptr);
            ptr_ = std::exchange(other.ptr_, nullptr);
            bytes_ = std::exchange(other.bytes_, 0);
        }
        return *this;
    }
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    ~Block() { reset(); }

    void reset() {
        if (ptr_) allocator_->free(ptr_);
        ptr_ = nullptr;
        bytes_ = 0;
    }
    template <typename T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    size_t bytes() const { return bytes_; }
    explicit operator bool() const { return ptr_ != nullptr; }

  private:
    alloc::CachingAllocator* allocator_ = nullptr;
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

std::string layer_name(int i) {
    return "layers." + std::to_string(i);
}

// What provenance declarations say: how a buffer of a quantized weight was
// computed from it.
const char* element_name(const fp8::QuantSpec& spec) {
    if (spec.recipe == fp8::Recipe::nvfp4) return "fp4_e2m1";
    return spec.dtype == fp8::Fp8Dtype::e4m3 ? "fp8_e4m3" : "fp8_e5m2";
}

std::string buffer_how(const fp8::QuantSpec& spec, const fp8::BufferSpec& b) {
    const std::string recipe = to_string(spec.recipe);
    const std::string cast = std::string("cast to ") + element_name(spec) + " (" + recipe + ")";
    switch (b.kind) {
        case fp8::BufferKind::rowwise_data:
            return cast + ", row-wise";
        case fp8::BufferKind::columnwise_data:
            // MXFP8 keeps its column-wise data [rows × cols]; the others
            // store it transposed.
            return cast + (spec.recipe == fp8::Recipe::mxfp8 ? ", column-wise"
                                                             : ", column-wise (transposed)");
        case fp8::BufferKind::rowwise_scale_inv:
            return spec.recipe == fp8::Recipe::delayed || spec.recipe == fp8::Recipe::current
                       ? recipe + " scale_inv"
                       : recipe + " row-wise scales";
        case fp8::BufferKind::columnwise_scale_inv:
            return recipe + " column-wise scales";
        case fp8::BufferKind::rowwise_amax:
            return recipe + " row-wise amax";
        case fp8::BufferKind::columnwise_amax:
            return recipe + " column-wise amax";
    }
    return cast;
}

// A quantized tensor held in allocator blocks, one per fp8::layout entry.
struct QuantizedBlocks {
    fp8::QuantSpec spec;
    fp8::Shape shape;
    std::vector<fp8::BufferSpec> layout;
    std::vector<Block> blocks;

    std::vector<void*> pointers() const {
        std::vector<void*> out;
        for (const Block& b : blocks)
            out.push_back(b.as<void>());
        return out;
    }
    const Block* find(fp8::BufferKind kind) const {
        for (size_t b = 0; b < layout.size(); ++b) {
            if (layout[b].kind == kind) return &blocks[b];
        }
        return nullptr;
    }
};

struct Param {
    ParamSpec spec;
    std::string module;        // "layers.3.attn.qkv": the tag of weight-derived tensors
    size_t offset = 0;         // element offset of its gradient shard in a reduce-scatter chunk
    size_t gather_offset = 0;  // byte offset of its shard in an all-gather chunk
    // The shard as stored: one bf16 buffer, or with --quantized-init the
    // buffers of a quantized [shard rows × cols] tensor (`quantized` set).
    std::vector<Block> shard;
    std::optional<fp8::QuantSpec> quantized;
    std::vector<fp8::BufferSpec> shard_layout;
    // With --quantized-init where the backward needs it (columnwise_plan
    // set): the column-wise form built after the backward all-gather, freed
    // after dgrad (--te fixed) or kept until this layer's next forward
    // (--te seed, problem 2).
    std::optional<fp8::ColumnwisePlan> columnwise_plan;
    std::vector<Block> columnwise;
    Block master;   // fp32 [shard_numel], FusedAdam's master weights
    Block exp_avg;  // fp32 moments, created by the first optimizer step
    Block exp_avg_sq;
    fp8::AmaxHistory history;  // delayed scaling of this weight
    // The forward's quantized copy, kept for backward under --te seed.
    std::optional<QuantizedBlocks> fp8_copy;
    // fp32 scratch of the layer being run, shared by parameter index across
    // layers (State::weight_scratch): the GEMM operand of the current pass
    // and the gradient of the current backward, both [rows × cols].
    float* weight = nullptr;
    float* grad = nullptr;
    WeightOperand operand;
};

struct Layer {
    std::vector<Param> params;
    // Per parameter, its shard buffers gathered: world × each buffer's size.
    std::vector<std::vector<Block>> unsharded;
    std::vector<Block> saved;  // model::layer_saved_specs order
    Block output;              // bf16 [T × H], the next layer's input
    Block rs_input;            // reduce-scatter input: world × chunk elements
    Block sharded_grads;       // reduce-scatter output, views per parameter
};

}  // namespace

struct Trainer::State {
    Options options;
    fp8::Arch arch;
    alloc::CachingAllocator& allocator;
    collective::Communicator& comm;
    Compute& compute;
    Provenance provenance;
    model::LayerConfig config;
    size_t chunk = 0;         // bf16 gradient elements of one rank's reduce-scatter chunk
    size_t gather_chunk = 0;  // bytes of one rank's all-gather chunk
    std::vector<Layer> layers;
    // The last all-gather output (world × gather_chunk bytes) and its layer.
    // FSDP2 keeps it until the next all-gather is issued (its AllGatherState),
    // so one flat buffer is alive at every forward hook.
    Block gathered;
    int gathered_layer = -1;
    Block input;   // bf16 [T × H]
    Block target;  // bf16 [T × H]
    // fp32 scratch shared by all parameters: a gathered tensor dequantized
    // rank by rank (world × shard elements), and a column-wise form before
    // its transpose.
    Scratch gather_scratch;
    Scratch transpose_scratch;
    // --retain sharded: a full column-wise form, before each rank keeps its
    // slice of it.
    Scratch columnwise_scratch;
    // One layer runs at a time: per parameter index, its fp32 GEMM operand
    // and gradient (Param::weight, Param::grad).
    std::vector<Scratch> weight_scratch;
    std::vector<Scratch> grad_scratch;
    int64_t optimizer_steps = 0;
    // What --inject keeps: freed when the trainer goes (the end of the run).
    std::vector<Block> injected;

    State(const Options& o, fp8::Arch a, alloc::CachingAllocator& al, collective::Communicator& c,
          Compute& co)
        : options(o), arch(a), allocator(al), comm(c), compute(co), provenance(o.provenance) {
        config = layer_config(o.shape);
        if (std::string problem = check_quantized_init_shards(o, world()); !problem.empty())
            throw std::invalid_argument(problem);
        init();
    }

    Block block(size_t bytes) { return Block(allocator, bytes); }
    uint64_t allocated() const { return allocator.stats().allocated_bytes.current; }
    int world() const { return comm.world_size(); }
    bool fp8() const { return options.recipe != fp8::Recipe::bf16; }
    // Recipes with one scale per tensor: a backend's FP8 GEMM can consume
    // their bytes directly.
    bool per_tensor() const {
        return options.recipe == fp8::Recipe::delayed || options.recipe == fp8::Recipe::current;
    }

    // Every rank draws the same full weights and keeps its rows, so the
    // model does not depend on the world size.
    void init() {
        const int w = world();
        const int r = comm.rank();
        std::mt19937 rng(options.seed);
        std::normal_distribution<float> normal(0.0f, 0.02f);
        layers.resize(size_t(options.shape.layers));
        size_t largest = 0, largest_gathered = 0, largest_columnwise = 0;
        for (int i = 0; i < options.shape.layers; ++i) {
            Layer& layer = layers[size_t(i)];
            size_t offset = 0, gather_offset = 0;
            for (const ParamSpec& spec : layer_params(options.shape)) {
                Param p;
                p.spec = spec;
                p.module = layer_name(i) + "." + spec.module;
                p.offset = offset;
                p.gather_offset = gather_offset;
                const size_t shard = size_t(spec.shard_numel(w));
                offset += shard;
                largest = std::max(largest, size_t(spec.numel()));
                largest_gathered = std::max(largest_gathered, shard * size_t(w));
                if (i == 0) {
                    weight_scratch.push_back(compute.scratch(size_t(spec.numel()) * sizeof(float)));
                    grad_scratch.push_back(compute.scratch(size_t(spec.numel()) * sizeof(float)));
                }
                const size_t index = layer.params.size();
                p.weight = weight_scratch.at(index).floats();
                p.grad = grad_scratch.at(index).floats();
                std::vector<float> full(size_t(spec.numel()));
                for (float& v : full) {
                    v = spec.role == ParamRole::gemm_weight                     ? normal(rng)
                        : spec.role == ParamRole::norm && spec.name == "weight" ? 1.0f
                                                                                : 0.0f;
                }
                ScopedTag tag(options.tagging, p.module.c_str(), "init");
                p.master = block(shard * sizeof(float));
                std::vector<float> mine(shard, 0.0f);
                const size_t begin = size_t(r) * shard;
                for (size_t k = 0; k < shard && begin + k < full.size(); ++k)
                    mine[k] = full[begin + k];
                compute.upload(p.master.as<void>(), mine.data(), shard * sizeof(float));
                std::string dtype = "bf16";
                if (options.quantized_init && spec.role == ParamRole::gemm_weight) {
                    fp8::QuantSpec q;
                    q.recipe = options.recipe;
                    q.role = fp8::TensorRole::weight;
                    q.arch = arch;
                    // MXFP8 all-gathers both usages (TE's fsdp_pre_all_gather
                    // sends column-wise data too); the others only row-wise.
                    q.columnwise = options.recipe == fp8::Recipe::mxfp8;
                    p.quantized = q;
                    p.shard_layout = fp8::layout(shard_shape(p), q);
                    if (fp8::builds_columnwise_after_gather(options.recipe, arch)) {
                        p.columnwise_plan =
                            fp8::columnwise_plan({size_t(spec.rows), size_t(spec.cols)},
                                                 size_t(spec.shard_rows(w)), size_t(w), q);
                        largest_columnwise = std::max(
                            largest_columnwise, fp8::requested_bytes(p.columnwise_plan->buffers));
                    }
                    for (const fp8::BufferSpec& b : p.shard_layout)
                        p.shard.push_back(block(b.bytes));
                    requantize_shard(p);
                    if (options.recipe == fp8::Recipe::delayed) {
                        // TE computes the initial scale of quantized parameters
                        // from their own amax, not the history's default of 1.
                        p.history.update(fp8::fp8_max(fp8::Fp8Dtype::e4m3));
                        requantize_shard(p);
                    }
                    dtype = to_string(options.recipe);
                } else {
                    p.shard.push_back(block(shard * sizeof(Bf16)));
                    compute.to_bf16(p.master.as<float>(), shard, p.shard[0].as<Bf16>());
                }
                for (const Block& b : p.shard)
                    gather_offset += b.bytes();
                allocscope_dl_register_param(p.module.c_str(), spec.name.c_str(),
                                             uint64_t(spec.numel()), dtype.c_str(), shard);
                layer.params.push_back(std::move(p));
            }
            chunk = offset;
            gather_chunk = gather_offset;
        }
        gather_scratch = compute.scratch(largest_gathered * sizeof(float));
        transpose_scratch = compute.scratch(largest * sizeof(float));
        if (options.retain == Retain::sharded && largest_columnwise > 0)
            columnwise_scratch = compute.scratch(largest_columnwise);
        const size_t th = config.tokens() * config.hidden;
        std::mt19937 data_rng(options.seed + 7919u * unsigned(r + 1));
        std::normal_distribution<float> unit(0.0f, 1.0f);
        std::vector<float> values(th);
        std::vector<Bf16> bf16(th);
        ScopedTag tag(options.tagging, "data", "init");
        input = block(th * sizeof(Bf16));
        for (float& v : values)
            v = unit(data_rng);
        model::to_bf16(values, bf16);
        compute.upload(input.as<void>(), bf16.data(), th * sizeof(Bf16));
        target = block(th * sizeof(Bf16));
        for (float& v : values)
            v = 0.5f * unit(data_rng);
        model::to_bf16(values, bf16);
        compute.upload(target.as<void>(), bf16.data(), th * sizeof(Bf16));
    }

    fp8::Shape shard_shape(const Param& p) const {
        return {size_t(p.spec.shard_rows(world())), size_t(p.spec.cols)};
    }

    // Quantized-init shards follow their fp32 master (TE casts the master
    // weights back into the FP8 parameters after each optimizer step).
    void requantize_shard(Param& p) {
        std::vector<void*> buffers;
        for (const Block& b : p.shard)
            buffers.push_back(b.as<void>());
        compute.quantize(p.master.as<float>(), shard_shape(p), *p.quantized,
                         options.recipe == fp8::Recipe::delayed ? &p.history : nullptr, buffers);
    }

    // fp32 values of the gathered parameter k of layer i into p.weight: bf16
    // widened, or each rank's quantized shard dequantized row-wise.
    void gathered_values(int i, size_t k) {
        Layer& layer = layers[size_t(i)];
        Param& p = layer.params[k];
        const size_t n = size_t(p.spec.numel());
        if (!p.quantized) {
            compute.to_float(layer.unsharded[k][0].as<Bf16>(), n, p.weight);
            return;
        }
        const int w = world();
        const size_t shard_elems = size_t(p.spec.shard_numel(w));
        for (int r = 0; r < w; ++r) {
            std::vector<const void*> buffers;
            for (size_t b = 0; b < p.shard_layout.size(); ++b) {
                buffers.push_back(layer.unsharded[k][b].as<uint8_t>() +
                                  size_t(r) * p.shard_layout[b].bytes);
            }
            compute.dequantize(buffers, shard_shape(p), *p.quantized, fp8::Usage::rowwise,
                               gather_scratch.floats() + size_t(r) * shard_elems);
        }
        // The last rank's padding rows are not part of the parameter.
        compute.copy(p.weight, gather_scratch.data(), n * sizeof(float));
    }

    // TE's post-all-gather hook of a quantized parameter whose backward
    // needs it column-wise: the column-wise form moved out of the gathered
    // row-wise bytes (fp8/columnwise.h), into memory TE allocates, not
    // FSDP2. --retain sharded keeps this rank's 1/world slice of each
    // buffer (its dim-0 shard of the [cols × rows] form), the size the TE
    // issue reports.
    void build_columnwise(int i, size_t k) {
        Layer& layer = layers[size_t(i)];
        Param& p = layer.params[k];
        const fp8::ColumnwisePlan& plan = *p.columnwise_plan;
        std::vector<const void*> gathered;
        for (const Block& b : layer.unsharded[k])
            gathered.push_back(b.as<void>());
        const bool sharded = options.retain == Retain::sharded;
        const size_t w = size_t(world());
        std::vector<void*> full;
        size_t at = 0;
        for (const fp8::BufferSpec& b : plan.buffers) {
            const size_t bytes = sharded ? (b.bytes + w - 1) / w : b.bytes;
            p.columnwise.push_back(block(bytes));
            const Block& made = p.columnwise.back();
            provenance.derived(made.as<void>(), p.module, p.spec.name, [&] {
                std::string how = buffer_how(*p.quantized, b) + ", from the all-gathered " +
                                  (b.kind == fp8::BufferKind::columnwise_data ? "row-wise data"
                                                                              : "row-wise scales");
                if (sharded) how += ", this rank's 1/" + std::to_string(w) + " slice";
                return how;
            });
            full.push_back(sharded ? static_cast<uint8_t*>(columnwise_scratch.data()) + at
                                   : made.as<void>());
            at += b.bytes;
        }
        compute.build_columnwise(plan, gathered, full);
        if (!sharded) return;
        const size_t r = size_t(comm.rank());
        for (size_t b = 0; b < plan.buffers.size(); ++b) {
            const Block& mine = p.columnwise[b];
            const size_t total = plan.buffers[b].bytes, begin = std::min(total, r * mine.bytes());
            const size_t n = std::min(mine.bytes(), total - begin);
            compute.copy(mine.as<void>(), static_cast<uint8_t*>(full[b]) + begin, n);
            if (n < mine.bytes()) compute.zero(mine.as<uint8_t>() + n, mine.bytes() - n);
        }
    }

    // --- FSDP2 unshard / reshard -------------------------------------------

    // Issues layer i's all-gather; the previous output is freed once the
    // new one exists.
    void all_gather(int i) {
        Layer& layer = layers[size_t(i)];
        Block flat = block(size_t(world()) * gather_chunk);
        auto* mine = flat.as<uint8_t>() + size_t(comm.rank()) * gather_chunk;
        for (const Param& p : layer.params) {
            size_t at = p.gather_offset;
            for (const Block& b : p.shard) {
                compute.copy(mine + at, b.as<void>(), b.bytes());
                at += b.bytes();
            }
        }
        compute.all_gather(mine, gather_chunk, flat.as<void>());
        gathered = std::move(flat);
        gathered_layer = i;
    }

    // Each shard buffer becomes an unsharded buffer of world × its size.
    void copy_out(int i) {
        Layer& layer = layers[size_t(i)];
        const size_t w = size_t(world());
        for (const Param& p : layer.params) {
            std::vector<Block> unsharded;
            size_t at = p.gather_offset;
            for (const Block& b : p.shard) {
                Block full = block(b.bytes() * w);
                for (size_t r = 0; r < w; ++r) {
                    compute.copy(full.as<uint8_t>() + r * b.bytes(),
                                 gathered.as<uint8_t>() + r * gather_chunk + at, b.bytes());
                }
                at += b.bytes();
                unsharded.push_back(std::move(full));
            }
            layer.unsharded.push_back(std::move(unsharded));
        }
    }

    // Forward: copy-out, then prefetch the next layer (which frees this
    // layer's flat buffer); the last layer's stays until backward.
    void unshard_forward(int i) {
        ScopedTag tag(options.tagging, nullptr, "forward/all_gather");
        if (gathered_layer != i) all_gather(i);
        copy_out(i);
        if (i + 1 < int(layers.size())) {
            ScopedTag next(options.tagging, layer_name(i + 1).c_str(), nullptr);
            all_gather(i + 1);
        }
    }

    // Backward: the flat buffer goes right after copy-out, then the
    // previous layer is prefetched. A quantized parameter's column-wise form
    // is built in between, as TE's post-all-gather hook builds it: in the
    // block's all-gather scope, outside the GEMM module.
    void unshard_backward(int i) {
        ScopedTag tag(options.tagging, nullptr, "backward/all_gather");
        if (gathered_layer != i) all_gather(i);
        copy_out(i);
        Layer& layer = layers[size_t(i)];
        for (size_t k = 0; k < layer.params.size(); ++k) {
            if (layer.params[k].columnwise_plan) build_columnwise(i, k);
        }
        gathered.reset();
        gathered_layer = -1;
        if (i > 0) {
            ScopedTag next(options.tagging, layer_name(i - 1).c_str(), nullptr);
            all_gather(i - 1);
        }
    }

    void reshard(int i) { layers[size_t(i)].unsharded.clear(); }

    // --- weights for the GEMMs -----------------------------------------------

    // Quantizes p.weight into new blocks, in TE's allocation order; current
    // scaling's two-float amax/scale workspace is allocated per call and
    // freed after it, as TE does.
    QuantizedBlocks quantize_weight(Param& p, bool rowwise, bool columnwise) {
        QuantizedBlocks q;
        q.spec.recipe = options.recipe;
        q.spec.dtype = fp8::Fp8Dtype::e4m3;
        q.spec.rowwise = rowwise;
        q.spec.columnwise = columnwise;
        q.spec.role = fp8::TensorRole::weight;
        q.spec.arch = arch;
        q.shape = {size_t(p.spec.rows), size_t(p.spec.cols)};
        q.layout = fp8::layout(q.shape, q.spec);
        for (const fp8::BufferSpec& b : q.layout) {
            q.blocks.push_back(block(b.bytes));
            provenance.derived(q.blocks.back().as<void>(), p.module, p.spec.name,
                               [&] { return buffer_how(q.spec, b); });
        }
        Block workspace;
        if (options.recipe == fp8::Recipe::current) {
            workspace = block(2 * sizeof(float));
            provenance.derived(workspace.as<void>(), p.module, p.spec.name,
                               [] { return std::string("current scaling amax and scale"); });
        }
        compute.quantize(p.weight, q.shape, q.spec,
                         options.recipe == fp8::Recipe::delayed ? &p.history : nullptr,
                         q.pointers());
        return q;
    }

    std::vector<const void*> const_pointers(const QuantizedBlocks& q) {
        std::vector<const void*> out;
        for (const Block& b : q.blocks)
            out.push_back(b.as<void>());
        return out;
    }

    // The FP8 bytes a backend's FP8 GEMM may use instead of p.weight.
    void set_fp8_operand(Param& p, const QuantizedBlocks& q) {
        if (!per_tensor()) return;
        const Block* scale = q.find(fp8::BufferKind::rowwise_scale_inv);
        if (!scale) return;
        if (const Block* data = q.find(fp8::BufferKind::rowwise_data); data && q.spec.rowwise) {
            p.operand.rowwise = data->as<uint8_t>();
            p.operand.rowwise_scale_inv = scale->as<float>();
        }
        if (const Block* t = q.find(fp8::BufferKind::columnwise_data); t && q.spec.columnwise) {
            p.operand.columnwise = t->as<uint8_t>();
            p.operand.columnwise_scale_inv = scale->as<float>();
        }
    }

    // p.weight ← the [rows × cols] form of q's column-wise usage.
    void columnwise_values(Param& p, const QuantizedBlocks& q) {
        compute.dequantize(const_pointers(q), q.shape, q.spec, fp8::Usage::columnwise,
                           transpose_scratch.floats());
        compute.transpose(transpose_scratch.floats(), size_t(p.spec.cols), size_t(p.spec.rows),
                          p.weight);
    }

    // Sets p.weight (and the FP8 operands) for this layer's forward GEMMs;
    // quantized copies that do not outlive the forward go to `transient`.
    void forward_weights(int i, std::vector<QuantizedBlocks>& transient) {
        Layer& layer = layers[size_t(i)];
        for (size_t k = 0; k < layer.params.size(); ++k) {
            Param& p = layer.params[k];
            p.operand = {};
            p.operand.values = p.weight;
            gathered_values(i, k);
            // The forward asks for row-wise usage: a retained column-wise
            // form goes only now.
            p.columnwise.clear();
            if (!fp8() || p.spec.role != ParamRole::gemm_weight || p.quantized) continue;
            const bool seed = options.te == TeBehaviour::seed;
            ScopedTag tag(options.tagging, p.module.c_str(), "forward/quantize");
            // Seed: a new copy with both usages, saved for backward (it is
            // not FSDP2's, so reshard does not free it). Fixed: row-wise only.
            QuantizedBlocks q = quantize_weight(p, true, seed);
            compute.dequantize(const_pointers(q), q.shape, q.spec, fp8::Usage::rowwise, p.weight);
            set_fp8_operand(p, q);
            if (seed) {
                p.fp8_copy = std::move(q);
            } else {
                transient.push_back(std::move(q));
            }
        }
    }

    // Sets p.weight (and the FP8 operands) for dgrad; blocks of a
    // column-wise re-quantization that do not outlive dgrad go to
    // `transient`. Quantized parameters run dgrad on their gathered values
    // (one scale per rank: no single-scale FP8 operand); their column-wise
    // form was built at the all-gather.
    void backward_weights(int i, std::vector<QuantizedBlocks>& transient) {
        Layer& layer = layers[size_t(i)];
        for (size_t k = 0; k < layer.params.size(); ++k) {
            Param& p = layer.params[k];
            p.operand = {};
            p.operand.values = p.weight;
            gathered_values(i, k);
            if (!fp8() || p.spec.role != ParamRole::gemm_weight || p.quantized) continue;
            if (p.fp8_copy) {
                columnwise_values(p, *p.fp8_copy);
                set_fp8_operand(p, *p.fp8_copy);
                p.operand.rowwise = nullptr;
            } else {
                ScopedTag tag(options.tagging, p.module.c_str(), "backward/quantize");
                QuantizedBlocks q = quantize_weight(p, false, true);
                columnwise_values(p, q);
                set_fp8_operand(p, q);
                transient.push_back(std::move(q));
            }
        }
    }

    LayerOperands operands(int i) {
        LayerOperands w{};
        for (size_t k = 0; k < w.size(); ++k)
            w[k] = layers[size_t(i)].params[k].operand;
        return w;
    }

    // --- passes ---------------------------------------------------------------

    model::LayerSaved<Bf16> saved_pointers(Layer& layer) {
        auto f = [&](size_t k) { return layer.saved[k].as<float>(); };
        auto b = [&](size_t k) { return layer.saved[k].as<Bf16>(); };
        return {f(0), f(1), b(2), b(3), f(4), b(5), b(6), f(7), f(8), b(9), b(10), b(11)};
    }

    const Bf16* layer_input(int i) const {
        return i == 0 ? input.as<Bf16>() : layers[size_t(i) - 1].output.as<Bf16>();
    }

    void forward(StepMemory& memory) {
        const size_t th = config.tokens() * config.hidden;
        for (int i = 0; i < int(layers.size()); ++i) {
            Layer& layer = layers[size_t(i)];
            ScopedTag tag(options.tagging, layer_name(i).c_str(), "forward");
            unshard_forward(i);
            std::vector<QuantizedBlocks> transient;
            forward_weights(i, transient);
            for (const model::SavedSpec& spec : model::layer_saved_specs(config)) {
                layer.saved.push_back(block(spec.bytes(sizeof(Bf16))));
            }
            layer.output = block(th * sizeof(Bf16));
            if (i == 0 && options.inject.leak_rank == comm.rank()) {
                // --inject leak-rank: one activation-sized block a step, on
                // one rank only.
                injected.push_back(block(th * sizeof(Bf16)));
            }
            compute.layer_forward(config, operands(i), layer_input(i), layer.output.as<Bf16>(),
                                  saved_pointers(layer));
            transient.clear();
            reshard(i);
            memory.after_layer_forward.push_back(allocated());
        }
    }

    double loss_and_gradient(Block& dy) {
        const size_t th = config.tokens() * config.hidden;
        ScopedTag tag(options.tagging, "loss", "backward");
        dy = block(th * sizeof(Bf16));
        float loss =
            compute.mse(layers.back().output.as<Bf16>(), target.as<Bf16>(), th, dy.as<Bf16>());
        comm.all_reduce(&loss, &loss, 1, collective::Op::avg);
        return loss;
    }

    void backward(Block dy) {
        const size_t th = config.tokens() * config.hidden;
        const int w = world();
        Block* previous_rs_input = nullptr;
        for (int i = int(layers.size()) - 1; i >= 0; --i) {
            Layer& layer = layers[size_t(i)];
            ScopedTag tag(options.tagging, layer_name(i).c_str(), "backward");
            unshard_backward(i);
            std::vector<QuantizedBlocks> transient;
            backward_weights(i, transient);
            model::LayerGrads grad_ptrs{};
            for (size_t k = 0; k < grad_ptrs.size(); ++k)
                grad_ptrs[k] = layer.params[k].grad;
            Block dx;
            {
                ScopedTag dgrad(options.tagging, nullptr, "backward/dgrad");
                dx = block(th * sizeof(Bf16));
            }
            compute.layer_backward(config, operands(i), layer_input(i), saved_pointers(layer),
                                   dy.as<Bf16>(), dx.as<Bf16>(), grad_ptrs);
            // Column-wise caches and the forward's copies go after dgrad;
            // under --te seed a quantized parameter's column-wise form stays
            // until its next forward.
            transient.clear();
            for (Param& p : layer.params) {
                p.fp8_copy.reset();
                if (options.te == TeBehaviour::fixed) p.columnwise.clear();
            }
            if (options.inject.retain_activation == i) {
                // --inject retain-activation: the largest saved activation
                // outlives the backward that consumed it.
                auto largest = std::max_element(
                    layer.saved.begin(), layer.saved.end(),
                    [](const Block& a, const Block& b) { return a.bytes() < b.bytes(); });
                injected.push_back(std::move(*largest));
            }
            layer.saved.clear();
            dy = std::move(dx);
            if (i > 0) layers[size_t(i) - 1].output.reset();
            std::vector<Block> unsharded_grads;
            {
                ScopedTag wgrad(options.tagging, nullptr, "backward/wgrad");
                for (const Param& p : layer.params) {
                    const size_t padded = size_t(p.spec.shard_numel(w)) * size_t(w);
                    Block g = block(padded * sizeof(Bf16));
                    compute.zero(g.as<void>(), padded * sizeof(Bf16));
                    compute.to_bf16(p.grad, size_t(p.spec.numel()), g.as<Bf16>());
                    unsharded_grads.push_back(std::move(g));
                }
            }
            {
                ScopedTag rs(options.tagging, nullptr, "backward/reduce_scatter");
                layer.rs_input = block(size_t(w) * chunk * sizeof(Bf16));
                for (size_t k = 0; k < layer.params.size(); ++k) {
                    const Param& p = layer.params[k];
                    const size_t shard = size_t(p.spec.shard_numel(w));
                    for (int r = 0; r < w; ++r) {
                        compute.copy(layer.rs_input.as<Bf16>() + size_t(r) * chunk + p.offset,
                                     unsharded_grads[k].as<Bf16>() + size_t(r) * shard,
                                     shard * sizeof(Bf16));
                    }
                }
                unsharded_grads.clear();
                // The previous layer's reduce-scatter input lives until now.
                if (previous_rs_input) previous_rs_input->reset();
                layer.sharded_grads = block(chunk * sizeof(Bf16));
                compute.reduce_scatter_avg(layer.rs_input.as<Bf16>(), chunk,
                                           layer.sharded_grads.as<Bf16>());
                previous_rs_input = &layer.rs_input;
            }
            reshard(i);
        }
        if (previous_rs_input) previous_rs_input->reset();
    }

    void optimizer() {
        ScopedTag tag(options.tagging, "optimizer", "optimizer");
        ++optimizer_steps;
        const int w = world();
        model::AdamConfig adam;
        for (size_t i = 0; i < layers.size(); ++i) {
            Layer& layer = layers[i];
            if (options.inject.grow_optimizer) {
                // --inject grow-optimizer: a state block per layer and step
                // that nothing frees, as an optimizer that appends state.
                ScopedTag state(options.tagging, layer_name(int(i)).c_str(), nullptr);
                injected.push_back(block(chunk * sizeof(float)));
                compute.zero(injected.back().as<void>(), chunk * sizeof(float));
            }
            for (Param& p : layer.params) {
                const size_t shard = size_t(p.spec.shard_numel(w));
                if (!p.exp_avg) {  // FusedAdam creates its state lazily
                    ScopedTag state(options.tagging, p.module.c_str(), nullptr);
                    p.exp_avg = block(shard * sizeof(float));
                    p.exp_avg_sq = block(shard * sizeof(float));
                    compute.zero(p.exp_avg.as<void>(), shard * sizeof(float));
                    compute.zero(p.exp_avg_sq.as<void>(), shard * sizeof(float));
                }
                compute.adam(adam, optimizer_steps, p.master.as<float>(),
                             layer.sharded_grads.as<Bf16>() + p.offset, p.exp_avg.as<float>(),
                             p.exp_avg_sq.as<float>(),
                             p.quantized ? nullptr : p.shard[0].as<Bf16>(), shard);
                if (options.recipe == fp8::Recipe::delayed) {
                    p.history.update(fp8::fp8_max(fp8::Fp8Dtype::e4m3));
                }
                if (p.quantized) requantize_shard(p);
            }
            layer.sharded_grads.reset();  // zero_grad(set_to_none=True)
        }
    }
};

Trainer::Trainer(const Options& options, fp8::Arch arch, alloc::CachingAllocator& allocator,
                 collective::Communicator& comm, Compute& compute)
    : state_(std::make_unique<State>(options, arch, allocator, comm, compute)) {}

Trainer::~Trainer() = default;

StepResult Trainer::step(int step) {
    State& s = *state_;
    auto t0 = std::chrono::steady_clock::now();
    tag_step(s.options.tagging, uint64_t(step));
    const alloc::MemoryStats at_start = s.allocator.stats();
    tag_allocator_counters(s.options.tagging, s.allocator.device(),
                           at_start.allocated_bytes.current, at_start.reserved_bytes.current,
                           s.compute.device_memory_used());
    StepResult result;
    s.forward(result.memory);
    result.memory.after_forward = s.allocated();
    Block dy;
    result.loss = s.loss_and_gradient(dy);
    s.backward(std::move(dy));
    result.memory.after_backward = s.allocated();
    s.optimizer();
    result.memory.after_optimizer = s.allocated();
    s.compute.synchronize();
    auto stats = s.allocator.stats();
    result.allocated = stats.allocated_bytes.current;
    result.reserved = stats.reserved_bytes.current;
    result.milliseconds =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return result;
}

}  // namespace allocscope::harness::trainer
