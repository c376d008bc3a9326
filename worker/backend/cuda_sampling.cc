// The CUDA backend's outputs: every wanted logits row back to the host (Forward), or tokens
// sampled on the GPU with only the rows someone reads copied back (ForwardAndSample): a
// decoding request then costs 8 bytes of copy instead of a vocabulary of floats and a
// host softmax on the scheduling thread.
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/skinny_gemm.h"
#include "worker/backend/cuda_backend_internal.h"

namespace lazykv::cuda_backend {

template <typename Keep>
absl::Status CudaBackend::CopyLogitsBack(const std::vector<LogitsRows>& wanted, Keep keep,
                                         std::vector<std::vector<float>>* logits) {
  const size_t vocab = c_.vocab_size;
  size_t end_row = 0;
  for (const LogitsRows& w : wanted) {
    if (keep(w.step)) end_row = std::max<size_t>(end_row, w.first + w.count);
  }
  RETURN_IF_ERROR(logits_host_.Reserve(std::max<size_t>(16, end_row * vocab * sizeof(float))));
  // One copy per run of adjacent kept rows, to the same rows of the pinned buffer.
  int begin = 0, end = 0;
  auto copy_run = [&]() {
    if (begin == end) return absl::OkStatus();
    return Cuda(cudaMemcpyAsync(logits_host_.as<float>() + begin * vocab, logits_.as<float>() + begin * vocab,
                                (end - begin) * vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                "logits copy");
  };
  for (const LogitsRows& w : wanted) {
    if (!keep(w.step)) continue;
    if (w.first != end) {
      RETURN_IF_ERROR(copy_run());
      begin = w.first;
    }
    end = w.first + w.count;
  }
  RETURN_IF_ERROR(copy_run());
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "forward"));
  for (const LogitsRows& w : wanted) {
    if (!keep(w.step)) continue;
    const float* src = logits_host_.as<float>() + w.first * vocab;
    (*logits)[w.step].assign(src, src + w.count * vocab);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Forward(std::span<const SequenceStep> steps, std::vector<std::vector<float>>* logits) {
  logits->assign(steps.size(), {});
  std::vector<LogitsRows> wanted;
  RETURN_IF_ERROR(RunModel(steps, &wanted));
  return CopyLogitsBack(
      wanted, [](size_t) { return true; }, logits);
}

absl::Status CudaBackend::ForwardAndSample(std::span<const SequenceStep> steps, std::span<const StepSampling> sampling,
                                           std::vector<SampledToken>* tokens, std::vector<std::vector<float>>* logits) {
  RETURN_IF_ERROR(ValidateSampling(steps, sampling));
  logits->assign(steps.size(), {});
  tokens->assign(steps.size(), SampledToken{.id = -1, .logprob = 0.0f});
  // A small decode step (one token each, a few rows) is timed (cuda_step_timing.h).
  size_t step_rows = 0;
  bool decode_only = true;
  for (const SequenceStep& step : steps) {
    step_rows += step.tokens.size();
    decode_only = decode_only && step.tokens.size() <= 1;
  }
  if (decode_only && step_rows > 0 && step_rows <= static_cast<size_t>(cuda::kSkinnyGemmFasterRows)) {
    step_timing_.Begin();
  } else {
    step_timing_.Abort();  // nothing left over from an earlier call is timed by this one
  }
  // Any return before End() below (an error) leaves nothing counted and no state behind.
  struct AbortUnlessEnded {
    StepTiming& timing;
    ~AbortUnlessEnded() { timing.Abort(); }
  } abort_unless_ended{step_timing_};
  std::vector<LogitsRows> wanted;
  RETURN_IF_ERROR(RunModel(steps, &wanted));

  std::vector<cuda::SampleRowParams> rows;
  std::vector<size_t> row_step;
  bool any_tempered = false;
  for (const LogitsRows& w : wanted) {
    const StepSampling& s = sampling[w.step];
    if (!s.sample) continue;
    rows.push_back(cuda::SampleRowParams{.logits_row = w.first + w.count - 1,
                                         .temperature = s.row.temperature,
                                         .top_p = s.row.top_p,
                                         .unused = 0,
                                         .uniform = s.row.uniform});
    row_step.push_back(w.step);
    any_tempered = any_tempered || s.row.temperature != 0.0f;
  }
  const int n = static_cast<int>(rows.size());
  if (n > 0) {
    const size_t in_bytes = n * sizeof(cuda::SampleRowParams), out_bytes = n * sizeof(cuda::SampledRow);
    RETURN_IF_ERROR(sample_rows_host_.Reserve(in_bytes));
    RETURN_IF_ERROR(sample_rows_.Reserve(in_bytes));
    RETURN_IF_ERROR(sample_out_.Reserve(out_bytes));
    RETURN_IF_ERROR(sample_out_host_.Reserve(out_bytes));
    // Greedy rows need no workspace (the probabilities are for tempered rows).
    const size_t ws_bytes = any_tempered ? cuda::SampleWorkspaceBytes(n, c_.vocab_size) : 0;
    RETURN_IF_ERROR(sample_ws_.Reserve(std::max<size_t>(16, ws_bytes)));
    RETURN_IF_ERROR(sample_slices_.Reserve(cuda::SampleGreedySlicesBytes(n, c_.vocab_size)));
    std::memcpy(sample_rows_host_.as<char>(), rows.data(), in_bytes);
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(sample_rows_.as<char>(), sample_rows_host_.as<char>(), in_bytes,
                                         cudaMemcpyHostToDevice, stream_),
                         "sampling parameters"));
    const cuda::SampleParams p{.logits = logits_.as<float>(),
                               .rows = sample_rows_.as<cuda::SampleRowParams>(),
                               .workspace = sample_ws_.as<float>(),
                               .out = sample_out_.as<cuda::SampledRow>(),
                               .num_rows = n,
                               .vocab = c_.vocab_size,
                               .greedy_slices = sample_slices_.as<char>()};
    RETURN_IF_ERROR(Cuda(cuda::LaunchSampleRows(p, stream_), "sampling"));
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(sample_out_host_.as<char>(), sample_out_.as<char>(), out_bytes,
                                         cudaMemcpyDeviceToHost, stream_),
                         "sampled tokens"));
  }
  step_timing_.MarkLastLaunch(stream_);
  RETURN_IF_ERROR(CopyLogitsBack(
      wanted, [&](size_t step) { return !sampling[step].sample || sampling[step].keep_logits; }, logits));
  step_timing_.End();  // the stream is synchronized
  const cuda::SampledRow* out = sample_out_host_.as<cuda::SampledRow>();
  for (int i = 0; i < n; ++i) (*tokens)[row_step[i]] = SampledToken{.id = out[i].id, .logprob = out[i].logprob};
  return absl::OkStatus();
}

}  // namespace lazykv::cuda_backend
