#include "trainer/trainer.h"

#include <allocscope/allocscope_dl.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>

#include "fp8/quantize.h"
#include "model/adam.h"
#include "model/kernels.h"
#include "model/transformer_layer.h"

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

void to_float(const Bf16* src, size_t n, float* dst) {
    model::to_float(std::span<const Bf16>(src, n), std::span<float>(dst, n));
}
void to_bf16(const float* src, size_t n, Bf16* dst) {
    model::to_bf16(std::span<const float>(src, n), std::span<Bf16>(dst, n));
}

// [rows × cols] row-major → [cols × rows] row-major.
std::vector<float> transpose(const std::vector<float>& m, size_t rows, size_t cols) {
    std::vector<float> t(m.size());
    for (size_t r = 0; r < rows; ++r) {
        for (size_t c = 0; c < cols; ++c)
            t[c * rows + r] = m[r * cols + c];
    }
    return t;
}

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
    // With --quantized-init and --te seed: the column-wise form built after
    // the backward all-gather, kept until this layer's next forward (problem 2).
    std::vector<Block> retained;
    Block master;   // fp32 [shard_numel], FusedAdam's master weights
    Block exp_avg;  // fp32 moments, created by the first optimizer step
    Block exp_avg_sq;
    fp8::AmaxHistory history;  // delayed scaling of this weight
    // The forward's quantized copy (its blocks) and its values, kept for
    // backward under --te seed.
    std::vector<Block> fp8_copy;
    std::optional<fp8::QuantizedTensor> fp8_values;
    std::vector<float> weight;  // fp32 GEMM operand of the current pass (scratch)
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
    std::vector<float> forward_workspace;
    std::vector<float> backward_workspace;
    int64_t optimizer_steps = 0;

    State(const Options& o, fp8::Arch a, alloc::CachingAllocator& al, collective::Communicator& c)
        : options(o), arch(a), allocator(al), comm(c) {
        const ModelShape& s = o.shape;
        config = {size_t(s.hidden), size_t(s.heads), size_t(s.ffn), size_t(s.seq), size_t(s.batch)};
        forward_workspace.resize(model::layer_forward_workspace_bytes(config) / sizeof(float));
        backward_workspace.resize(model::layer_backward_workspace_bytes(config) / sizeof(float));
        init();
    }

    Block block(size_t bytes) { return Block(allocator, bytes); }
    uint64_t allocated() const { return allocator.stats().allocated_bytes.current; }
    int world() const { return comm.world_size(); }
    bool fp8() const { return options.recipe != fp8::Recipe::bf16; }

    // Every rank draws the same full weights and keeps its rows, so the
    // model does not depend on the world size.
    void init() {
        const int w = world();
        const int r = comm.rank();
        std::mt19937 rng(options.seed);
        std::normal_distribution<float> normal(0.0f, 0.02f);
        layers.resize(size_t(options.shape.layers));
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
                std::vector<float> full(size_t(spec.numel()));
                for (float& v : full) {
                    v = spec.role == ParamRole::gemm_weight                     ? normal(rng)
                        : spec.role == ParamRole::norm && spec.name == "weight" ? 1.0f
                                                                                : 0.0f;
                }
                allocscope::ScopedTag tag(p.module.c_str(), "init");
                p.master = block(shard * sizeof(float));
                auto* master = p.master.as<float>();
                const size_t begin = size_t(r) * shard;
                for (size_t k = 0; k < shard; ++k) {
                    master[k] = begin + k < full.size() ? full[begin + k] : 0.0f;
                }
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
                    to_bf16(master, shard, p.shard[0].as<Bf16>());
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
        const size_t th = config.tokens() * config.hidden;
        std::mt19937 data_rng(options.seed + 7919u * unsigned(r + 1));
        std::normal_distribution<float> unit(0.0f, 1.0f);
        std::vector<float> values(th);
        allocscope::ScopedTag tag("data", "init");
        input = block(th * sizeof(Bf16));
        for (float& v : values)
            v = unit(data_rng);
        to_bf16(values.data(), th, input.as<Bf16>());
        target = block(th * sizeof(Bf16));
        for (float& v : values)
            v = 0.5f * unit(data_rng);
        to_bf16(values.data(), th, target.as<Bf16>());
    }

    fp8::Shape shard_shape(const Param& p) const {
        return {size_t(p.spec.shard_rows(world())), size_t(p.spec.cols)};
    }

    // Quantized-init shards follow their fp32 master (TE casts the master
    // weights back into the FP8 parameters after each optimizer step).
    void requantize_shard(Param& p) {
        const size_t n = size_t(p.spec.shard_numel(world()));
        std::span<const float> values(p.master.as<float>(), n);
        fp8::QuantizedTensor q =
            options.recipe == fp8::Recipe::delayed
                ? fp8::quantize(values, shard_shape(p), *p.quantized, p.history)
                : fp8::quantize(values, shard_shape(p), *p.quantized);
        for (size_t b = 0; b < q.buffers.size(); ++b) {
            std::memcpy(p.shard[b].as<uint8_t>(), q.buffers[b].bytes.data(),
                        q.buffers[b].spec.bytes);
        }
    }

    // fp32 values of the gathered parameter k of layer i: bf16 widened, or
    // each rank's quantized shard dequantized row-wise.
    void gathered_values(int i, size_t k, std::vector<float>& out) {
        Layer& layer = layers[size_t(i)];
        Param& p = layer.params[k];
        const size_t n = size_t(p.spec.numel());
        out.resize(n);
        if (!p.quantized) {
            to_float(layer.unsharded[k][0].as<Bf16>(), n, out.data());
            return;
        }
        const int w = world();
        const size_t shard_elems = size_t(p.spec.shard_numel(w));
        for (int r = 0; r < w; ++r) {
            fp8::QuantizedTensor q;
            q.shape = shard_shape(p);
            q.spec = *p.quantized;
            for (size_t b = 0; b < p.shard_layout.size(); ++b) {
                const size_t bytes = p.shard_layout[b].bytes;
                const auto* src = layer.unsharded[k][b].as<uint8_t>() + size_t(r) * bytes;
                q.buffers.push_back({p.shard_layout[b], std::vector<uint8_t>(src, src + bytes)});
            }
            std::vector<float> v = fp8::dequantize(q, fp8::Usage::rowwise);
            const size_t begin = size_t(r) * shard_elems;
            for (size_t e = 0; e < shard_elems && begin + e < n; ++e)
                out[begin + e] = v[e];
        }
    }

    // Problem 2's column-wise form: per-tensor recipes where the GEMM needs TN
    // (sm90) build a transpose; Float8BlockScaling builds its column-wise
    // data on every GPU; MXFP8 gathered it and builds nothing.
    bool builds_columnwise(const Param& p) const {
        if (!p.quantized) return false;
        switch (options.recipe) {
            case fp8::Recipe::delayed:
            case fp8::Recipe::current:
                return arch == fp8::Arch::sm90;
            case fp8::Recipe::block:
                return true;
            default:
                return false;
        }
    }

    std::vector<Block> build_columnwise(const Param& p) {
        fp8::QuantSpec spec = *p.quantized;
        spec.rowwise = false;
        spec.columnwise = true;
        std::vector<Block> out;
        const fp8::Shape full{size_t(p.spec.rows), size_t(p.spec.cols)};
        for (const fp8::BufferSpec& b : fp8::layout(full, spec)) {
            // The scale_inv of a per-tensor transpose is the tensor's own.
            if (b.kind == fp8::BufferKind::rowwise_scale_inv) continue;
            size_t bytes = b.bytes;
            if (options.retain == Retain::sharded)
                bytes = (bytes + size_t(world()) - 1) / size_t(world());
            out.push_back(block(bytes));
        }
        return out;
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
                std::memcpy(mine + at, b.as<uint8_t>(), b.bytes());
                at += b.bytes();
            }
        }
        comm.all_gather(mine, gather_chunk, flat.as<uint8_t>());
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
                    std::memcpy(full.as<uint8_t>() + r * b.bytes(),
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
        allocscope::ScopedTag tag(nullptr, "forward/all_gather");
        if (gathered_layer != i) all_gather(i);
        copy_out(i);
        if (i + 1 < int(layers.size())) {
            allocscope::ScopedTag next(layer_name(i + 1).c_str(), nullptr);
            all_gather(i + 1);
        }
    }

    // Backward: the flat buffer goes right after copy-out, then the
    // previous layer is prefetched.
    void unshard_backward(int i) {
        allocscope::ScopedTag tag(nullptr, "backward/all_gather");
        if (gathered_layer != i) all_gather(i);
        copy_out(i);
        gathered.reset();
        gathered_layer = -1;
        if (i > 0) {
            allocscope::ScopedTag next(layer_name(i - 1).c_str(), nullptr);
            all_gather(i - 1);
        }
    }

    void reshard(int i) { layers[size_t(i)].unsharded.clear(); }

    // --- weights for the GEMMs -----------------------------------------------

    fp8::QuantizedTensor quantize_weight(Param& p, const std::vector<float>& values, bool rowwise,
                                         bool columnwise) {
        fp8::QuantSpec spec;
        spec.recipe = options.recipe;
        spec.dtype = fp8::Fp8Dtype::e4m3;
        spec.rowwise = rowwise;
        spec.columnwise = columnwise;
        spec.role = fp8::TensorRole::weight;
        spec.arch = arch;
        fp8::Shape shape{size_t(p.spec.rows), size_t(p.spec.cols)};
        if (options.recipe == fp8::Recipe::delayed) {
            return fp8::quantize(values, shape, spec, p.history);
        }
        // Current scaling computes the amax and scale into a two-float
        // workspace that TE allocates per quantize call and frees after it.
        Block workspace;
        if (options.recipe == fp8::Recipe::current) workspace = block(2 * sizeof(float));
        return fp8::quantize(values, shape, spec);
    }

    // The quantized tensor's buffers as blocks, in TE's allocation order.
    std::vector<Block> materialize(const fp8::QuantizedTensor& q) {
        std::vector<Block> blocks;
        for (const fp8::QuantizedBuffer& b : q.buffers) {
            Block blk = block(b.spec.bytes);
            std::memcpy(blk.as<uint8_t>(), b.bytes.data(), b.spec.bytes);
            blocks.push_back(std::move(blk));
        }
        return blocks;
    }

    // Fills p.weight with the fp32 operand of this layer's forward GEMMs.
    void forward_weights(int i, std::vector<std::vector<Block>>& transient) {
        Layer& layer = layers[size_t(i)];
        for (size_t k = 0; k < layer.params.size(); ++k) {
            Param& p = layer.params[k];
            gathered_values(i, k, p.weight);
            // The forward asks for row-wise usage: a retained column-wise
            // form goes only now.
            p.retained.clear();
            if (!fp8() || p.spec.role != ParamRole::gemm_weight || p.quantized) continue;
            const bool seed = options.te == TeBehaviour::seed;
            allocscope::ScopedTag tag(p.module.c_str(), "forward/quantize");
            // Seed: a new copy with both usages, saved for backward (it is
            // not FSDP2's, so reshard does not free it). Fixed: row-wise only.
            fp8::QuantizedTensor q = quantize_weight(p, p.weight, true, seed);
            p.weight = fp8::dequantize(q, fp8::Usage::rowwise);
            if (seed) {
                p.fp8_copy = materialize(q);
                p.fp8_values = std::move(q);
            } else {
                transient.push_back(materialize(q));
            }
        }
    }

    // Fills p.weight with the fp32 operand of dgrad; blocks of a column-wise
    // re-quantization or transpose that do not outlive dgrad go to
    // `transient`.
    void backward_weights(int i, std::vector<std::vector<Block>>& transient) {
        Layer& layer = layers[size_t(i)];
        const bool seed = options.te == TeBehaviour::seed;
        for (size_t k = 0; k < layer.params.size(); ++k) {
            Param& p = layer.params[k];
            gathered_values(i, k, p.weight);
            if (!fp8() || p.spec.role != ParamRole::gemm_weight) continue;
            const size_t rows = size_t(p.spec.rows), cols = size_t(p.spec.cols);
            if (p.quantized) {
                if (!builds_columnwise(p)) continue;
                allocscope::ScopedTag tag(p.module.c_str(), "backward/transpose");
                if (seed) {
                    p.retained = build_columnwise(p);
                } else {
                    transient.push_back(build_columnwise(p));
                }
            } else if (p.fp8_values) {
                p.weight =
                    transpose(fp8::dequantize(*p.fp8_values, fp8::Usage::columnwise), cols, rows);
            } else {
                allocscope::ScopedTag tag(p.module.c_str(), "backward/quantize");
                fp8::QuantizedTensor q = quantize_weight(p, p.weight, false, true);
                p.weight = transpose(fp8::dequantize(q, fp8::Usage::columnwise), cols, rows);
                transient.push_back(materialize(q));
            }
        }
    }

    model::LayerWeights weight_pointers(int i) {
        model::LayerWeights w{};
        for (size_t k = 0; k < w.size(); ++k)
            w[k] = layers[size_t(i)].params[k].weight.data();
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
            allocscope::ScopedTag tag(layer_name(i).c_str(), "forward");
            unshard_forward(i);
            std::vector<std::vector<Block>> transient;
            forward_weights(i, transient);
            for (const model::SavedSpec& spec : model::layer_saved_specs(config)) {
                layer.saved.push_back(block(spec.bytes(sizeof(Bf16))));
            }
            layer.output = block(th * sizeof(Bf16));
            model::layer_forward<Bf16>(config, weight_pointers(i), layer_input(i),
                                       layer.output.as<Bf16>(), saved_pointers(layer),
                                       forward_workspace.data());
            transient.clear();
            reshard(i);
            memory.after_layer_forward.push_back(allocated());
        }
    }

    double loss_and_gradient(Block& dy) {
        const size_t th = config.tokens() * config.hidden;
        std::vector<float> y(th), t(th), g(th);
        to_float(layers.back().output.as<Bf16>(), th, y.data());
        to_float(target.as<Bf16>(), th, t.data());
        float loss = model::mse_loss_forward(th, y.data(), t.data());
        model::mse_loss_backward(th, y.data(), t.data(), 1.0f, g.data());
        allocscope::ScopedTag tag("loss", "backward");
        dy = block(th * sizeof(Bf16));
        to_bf16(g.data(), th, dy.as<Bf16>());
        comm.all_reduce(&loss, &loss, 1, collective::Op::avg);
        return loss;
    }

    void backward(Block dy) {
        const size_t th = config.tokens() * config.hidden;
        const int w = world();
        Block* previous_rs_input = nullptr;
        for (int i = int(layers.size()) - 1; i >= 0; --i) {
            Layer& layer = layers[size_t(i)];
            allocscope::ScopedTag tag(layer_name(i).c_str(), "backward");
            unshard_backward(i);
            std::vector<std::vector<Block>> transient;
            backward_weights(i, transient);
            std::vector<std::vector<float>> grads(layer.params.size());
            model::LayerGrads grad_ptrs{};
            for (size_t k = 0; k < grads.size(); ++k) {
                grads[k].resize(size_t(layer.params[k].spec.numel()));
                grad_ptrs[k] = grads[k].data();
            }
            Block dx;
            {
                allocscope::ScopedTag dgrad(nullptr, "backward/dgrad");
                dx = block(th * sizeof(Bf16));
            }
            model::layer_backward<Bf16>(config, weight_pointers(i), layer_input(i),
                                        saved_pointers(layer), dy.as<Bf16>(), dx.as<Bf16>(),
                                        grad_ptrs, backward_workspace.data());
            // Column-wise caches and the forward's copies go after dgrad.
            transient.clear();
            for (Param& p : layer.params) {
                p.fp8_copy.clear();
                p.fp8_values.reset();
            }
            layer.saved.clear();
            dy = std::move(dx);
            if (i > 0) layers[size_t(i) - 1].output.reset();
            std::vector<Block> unsharded_grads;
            {
                allocscope::ScopedTag wgrad(nullptr, "backward/wgrad");
                for (size_t k = 0; k < grads.size(); ++k) {
                    const size_t padded = size_t(layer.params[k].spec.shard_numel(w)) * size_t(w);
                    Block g = block(padded * sizeof(Bf16));
                    std::memset(g.as<Bf16>(), 0, padded * sizeof(Bf16));
                    to_bf16(grads[k].data(), grads[k].size(), g.as<Bf16>());
                    unsharded_grads.push_back(std::move(g));
                }
            }
            {
                allocscope::ScopedTag rs(nullptr, "backward/reduce_scatter");
                layer.rs_input = block(size_t(w) * chunk * sizeof(Bf16));
                for (size_t k = 0; k < layer.params.size(); ++k) {
                    const Param& p = layer.params[k];
                    const size_t shard = size_t(p.spec.shard_numel(w));
                    for (int r = 0; r < w; ++r) {
                        std::memcpy(layer.rs_input.as<Bf16>() + size_t(r) * chunk + p.offset,
                                    unsharded_grads[k].as<Bf16>() + size_t(r) * shard,
                                    shard * sizeof(Bf16));
                    }
                }
                unsharded_grads.clear();
                // The previous layer's reduce-scatter input lives until now.
                if (previous_rs_input) previous_rs_input->reset();
                layer.sharded_grads = block(chunk * sizeof(Bf16));
                comm.reduce_scatter_bf16(
                    reinterpret_cast<const uint16_t*>(layer.rs_input.as<Bf16>()), chunk,
                    reinterpret_cast<uint16_t*>(layer.sharded_grads.as<Bf16>()),
                    collective::Op::avg);
                previous_rs_input = &layer.rs_input;
            }
            reshard(i);
        }
        if (previous_rs_input) previous_rs_input->reset();
    }

    void optimizer() {
        allocscope::ScopedTag tag("optimizer", "optimizer");
        ++optimizer_steps;
        const int w = world();
        model::AdamConfig adam;
        for (Layer& layer : layers) {
            for (Param& p : layer.params) {
                const size_t shard = size_t(p.spec.shard_numel(w));
                if (!p.exp_avg) {  // FusedAdam creates its state lazily
                    allocscope::ScopedTag state(p.module.c_str(), nullptr);
                    p.exp_avg = block(shard * sizeof(float));
                    p.exp_avg_sq = block(shard * sizeof(float));
                    std::memset(p.exp_avg.as<float>(), 0, shard * sizeof(float));
                    std::memset(p.exp_avg_sq.as<float>(), 0, shard * sizeof(float));
                }
                std::vector<float> grad(shard);
                to_float(layer.sharded_grads.as<Bf16>() + p.offset, shard, grad.data());
                std::span<Bf16> model_weights;
                if (!p.quantized) model_weights = {p.shard[0].as<Bf16>(), shard};
                model::adam_step(adam, optimizer_steps, {p.master.as<float>(), shard}, grad,
                                 {p.exp_avg.as<float>(), shard}, {p.exp_avg_sq.as<float>(), shard},
                                 model_weights);
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
                 collective::Communicator& comm)
    : state_(std::make_unique<State>(options, arch, allocator, comm)) {}

Trainer::~Trainer() = default;

StepResult Trainer::step(int step) {
    State& s = *state_;
    auto t0 = std::chrono::steady_clock::now();
    allocscope_dl_step(uint64_t(step));
    StepResult result;
    s.forward(result.memory);
    result.memory.after_forward = s.allocated();
    Block dy;
    result.loss = s.loss_and_gradient(dy);
    s.backward(std::move(dy));
    result.memory.after_backward = s.allocated();
    s.optimizer();
    result.memory.after_optimizer = s.allocated();
    auto stats = s.allocator.stats();
    result.allocated = stats.allocated_bytes.current;
    result.reserved = stats.reserved_bytes.current;
    result.milliseconds =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return result;
}

}  // namespace allocscope::harness::trainer
