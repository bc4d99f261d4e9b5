#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "collective/communicator.h"
#include "model/kernels.h"
#include "trainer/compute.h"

namespace allocscope::harness::trainer {

namespace {

using model::Bf16;

class HostCompute final : public Compute {
  public:
    HostCompute(collective::Communicator& comm, const model::LayerConfig& config)
        : comm_(comm),
          forward_workspace_(model::layer_forward_workspace_bytes(config) / sizeof(float)),
          backward_workspace_(model::layer_backward_workspace_bytes(config) / sizeof(float)) {}

    const char* name() const override { return "sim"; }

    Scratch scratch(std::size_t bytes) override {
        void* p = std::calloc(bytes ? bytes : 1, 1);
        if (!p) throw std::bad_alloc();
        return Scratch(p, bytes, [](void* q) { std::free(q); });
    }

    void upload(void* dst, const void* src, std::size_t bytes) override {
        std::memcpy(dst, src, bytes);
    }
    void download(void* dst, const void* src, std::size_t bytes) override {
        std::memcpy(dst, src, bytes);
    }
    void copy(void* dst, const void* src, std::size_t bytes) override {
        std::memmove(dst, src, bytes);
    }
    void zero(void* dst, std::size_t bytes) override { std::memset(dst, 0, bytes); }

    void to_bf16(const float* src, std::size_t n, Bf16* dst) override {
        model::to_bf16(std::span<const float>(src, n), std::span<Bf16>(dst, n));
    }
    void to_float(const Bf16* src, std::size_t n, float* dst) override {
        model::to_float(std::span<const Bf16>(src, n), std::span<float>(dst, n));
    }
    void transpose(const float* src, std::size_t rows, std::size_t cols, float* dst) override {
        for (std::size_t r = 0; r < rows; ++r) {
            for (std::size_t c = 0; c < cols; ++c)
                dst[c * rows + r] = src[r * cols + c];
        }
    }

    void quantize(const float* values, fp8::Shape shape, const fp8::QuantSpec& spec,
                  fp8::AmaxHistory* history, std::span<void* const> buffers) override {
        std::span<const float> in(values, shape.rows * shape.cols);
        fp8::QuantizedTensor q =
            history ? fp8::quantize(in, shape, spec, *history) : fp8::quantize(in, shape, spec);
        if (q.buffers.size() != buffers.size()) {
            throw std::invalid_argument("quantize: " + std::to_string(buffers.size()) +
                                        " buffers given, the layout has " +
                                        std::to_string(q.buffers.size()));
        }
        for (std::size_t b = 0; b < buffers.size(); ++b)
            std::memcpy(buffers[b], q.buffers[b].bytes.data(), q.buffers[b].spec.bytes);
    }

    void dequantize(std::span<const void* const> buffers, fp8::Shape shape,
                    const fp8::QuantSpec& spec, fp8::Usage usage, float* out) override {
        fp8::QuantizedTensor q;
        q.shape = shape;
        q.spec = spec;
        const std::vector<fp8::BufferSpec> layout = fp8::layout(shape, spec);
        if (layout.size() != buffers.size()) {
            throw std::invalid_argument("dequantize: " + std::to_string(buffers.size()) +
                                        " buffers given, the layout has " +
                                        std::to_string(layout.size()));
        }
        for (std::size_t b = 0; b < layout.size(); ++b) {
            const auto* src = static_cast<const std::uint8_t*>(buffers[b]);
            q.buffers.push_back({layout[b], std::vector<std::uint8_t>(src, src + layout[b].bytes)});
        }
        std::vector<float> v = fp8::dequantize(q, usage);
        std::memcpy(out, v.data(), v.size() * sizeof(float));
    }

    void build_columnwise(const fp8::ColumnwisePlan& plan, std::span<const void* const> gathered,
                          std::span<void* const> out) override {
        fp8::build_columnwise(plan, gathered, out);
    }

    void layer_forward(const model::LayerConfig& config, const LayerOperands& weights,
                       const Bf16* x, Bf16* y, const model::LayerSaved<Bf16>& saved) override {
        model::layer_forward<Bf16>(config, values(weights), x, y, saved, forward_workspace_.data());
    }
    void layer_backward(const model::LayerConfig& config, const LayerOperands& weights,
                        const Bf16* x, const model::LayerSaved<Bf16>& saved, const Bf16* dy,
                        Bf16* dx, const model::LayerGrads& grads) override {
        model::layer_backward<Bf16>(config, values(weights), x, saved, dy, dx, grads,
                                    backward_workspace_.data());
    }

    float mse(const Bf16* y, const Bf16* target, std::size_t n, Bf16* dy) override {
        std::vector<float> yf(n), tf(n), g(n);
        to_float(y, n, yf.data());
        to_float(target, n, tf.data());
        const float loss = model::mse_loss_forward(n, yf.data(), tf.data());
        model::mse_loss_backward(n, yf.data(), tf.data(), 1.0f, g.data());
        to_bf16(g.data(), n, dy);
        return loss;
    }

    void adam(const model::AdamConfig& config, std::int64_t step, float* master, const Bf16* grad,
              float* exp_avg, float* exp_avg_sq, Bf16* weights, std::size_t n) override {
        std::vector<float> g(n);
        to_float(grad, n, g.data());
        std::span<Bf16> model_weights;
        if (weights) model_weights = {weights, n};
        model::adam_step(config, step, {master, n}, g, {exp_avg, n}, {exp_avg_sq, n},
                         model_weights);
    }

    void all_gather(const void* mine, std::size_t bytes_per_rank, void* out) override {
        comm_.all_gather(mine, bytes_per_rank, out);
    }
    void reduce_scatter_avg(const Bf16* in, std::size_t count_per_rank, Bf16* out) override {
        comm_.reduce_scatter_bf16(reinterpret_cast<const std::uint16_t*>(in), count_per_rank,
                                  reinterpret_cast<std::uint16_t*>(out), collective::Op::avg);
    }

    void synchronize() override {}

  private:
    static model::LayerWeights values(const LayerOperands& operands) {
        model::LayerWeights w{};
        for (std::size_t k = 0; k < w.size(); ++k)
            w[k] = operands[k].values;
        return w;
    }

    collective::Communicator& comm_;
    std::vector<float> forward_workspace_;
    std::vector<float> backward_workspace_;
};

}  // namespace

std::unique_ptr<Compute> make_host_compute(collective::Communicator& comm,
                                           const model::LayerConfig& config) {
    return std::make_unique<HostCompute>(comm, config);
}

}  // namespace allocscope::harness::trainer
