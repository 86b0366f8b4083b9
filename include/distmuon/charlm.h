#pragma once
// A character-level language model with a hand-written forward and backward pass over BLAS: the
// model distmuon trains with Muon on sharded weights.
//
// For a window of C context bytes predicting the next byte (B windows per batch):
//   x0 = concat(embedding[t_1], ..., embedding[t_C])          [B, C*E]
//   h  = x0 W_in^T                                             [B, H]
//   L blocks:  h = h + GELU(rmsnorm(h) fc1^T) fc2^T             fc1 [F, H], fc2 [H, F]
//   logits = rmsnorm(h) head^T                                 [B, V]
//   loss = mean over the batch of -log softmax(logits)[target]  (nats)
// rmsnorm(x) = x / sqrt(mean(x^2) + eps), without a learned gain (as in modded-nanogpt), so every
// parameter is a matrix. GELU is the exact one, x Phi(x). There are no biases.
//
// Every weight is a row-major Matrix [out, in] and a layer computes y = x W^T. The embedding
// [V, E] and the output head [V, H] are AdamW parameters; the input projection, fc1 and fc2 are
// Muon parameters (see CharLmParamInfo::kind).

#include <cstdint>
#include <string>
#include <vector>

#include "distmuon/compute.h"
#include "distmuon/matrix.h"

namespace distmuon {

// The defaults are the training run's default model (configs/train-default.json, kept equal by a
// test). Its Muon shapes at H = 256, F = 2048: input 256 x 512, fc1 2048 x 256, fc2 256 x 2048.
struct CharLmConfig {
  int vocab = 256;   // V: token ids are bytes, so 256 covers any file
  int context = 16;  // C: bytes of context per prediction
  int embed = 32;    // E: embedding width per context byte
  int hidden = 256;  // H: width of the residual stream
  int ffn = 2048;    // F: width of each block's MLP
  int layers = 6;    // L: residual MLP blocks
  float norm_eps = 1e-5f;

  // Throws distmuon::Error naming the invalid field.
  void validate() const;
  friend bool operator==(const CharLmConfig&, const CharLmConfig&) = default;
};

// Which optimizer a parameter belongs to: Muon for the hidden matrices, AdamW for the embedding
// and the output head (as Muon recommends).
enum class ParamKind { kMuon, kAdamW };
const char* to_string(ParamKind kind);

struct CharLmParamInfo {
  std::string name;  // "embedding", "input", "blocks.<l>.fc1", "blocks.<l>.fc2", "head"
  ParamKind kind = ParamKind::kMuon;
  Index rows = 0, cols = 0;
};

// The parameters, in a fixed order: embedding, input, blocks.0.fc1, blocks.0.fc2, ..., head.
std::vector<CharLmParamInfo> charlm_param_infos(const CharLmConfig& config);

// All weights (or all gradients) of a model.
struct CharLmWeights {
  Matrix embedding;         // [V, E]
  Matrix input;             // [H, C*E]
  std::vector<Matrix> fc1;  // L x [F, H]
  std::vector<Matrix> fc2;  // L x [H, F]
  Matrix head;              // [V, H]

  // Zero matrices of the config's shapes.
  static CharLmWeights zeros(const CharLmConfig& config);
  // The matrices in charlm_param_infos() order.
  std::vector<Matrix*> list();
  std::vector<const Matrix*> list() const;
};

// Deterministic initialisation from a seed, identical on every machine: entry (i, j) of parameter
// p is a Gaussian drawn from a counter-based generator keyed by (seed, p, i, j), so a row shard
// can be initialised without the rest of the matrix. Standard deviations: embedding 1; input,
// fc1 and head 1/sqrt(fan_in); fc2 1/sqrt(F * 2L) (GPT-2's residual scaling), so the residual
// stream keeps unit scale as blocks are added.
CharLmWeights init_charlm_weights(const CharLmConfig& config, std::uint64_t seed);
// Rows [row0, row0 + rows) of parameter `index` (charlm_param_infos order) as init_charlm_weights
// draws them; rows past the parameter's end are zeros (padding).
Matrix init_charlm_rows(const CharLmConfig& config, std::uint64_t seed, std::size_t index,
                        Index row0, Index rows);

// A batch of B windows: tokens[b * C + c] is byte c of window b, targets[b] the byte after it.
struct CharBatch {
  int context = 0;
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
  Index size() const { return static_cast<Index>(targets.size()); }
};

// Forward and backward of the model. Holds the activations of the last forward as workspace, so
// one object serves one thread; reusing it across batches of the same size does not allocate.
class CharLm {
 public:
  explicit CharLm(CharLmConfig config);

  const CharLmConfig& config() const { return config_; }

  // Mean cross-entropy of the batch in nats (accumulated in double). When grads is not null it
  // receives d(loss)/d(weights) for every parameter (overwritten, not accumulated); grads must
  // have the config's shapes (CharLmWeights::zeros). Throws on an empty batch, a token or target
  // outside [0, vocab), a batch of the wrong context, or weights of the wrong shapes.
  // The model is host code: weights, batch and grads are host Matrix, so compute must run on
  // host memory (cpu_compute()); it is named by every caller, never assumed.
  double forward_backward(const CharLmWeights& weights, const CharBatch& batch,
                          CharLmWeights* grads, Compute& compute);
  double loss(const CharLmWeights& weights, const CharBatch& batch, Compute& compute) {
    return forward_backward(weights, batch, nullptr, compute);
  }

  // Matrix-multiply FLOPs per window: forward (2 per multiply-add of every layer) and backward
  // (twice the forward: the input and the weight gradients).
  static double forward_flops_per_window(const CharLmConfig& config);
  static double train_flops_per_window(const CharLmConfig& config) {
    return 3.0 * forward_flops_per_window(config);
  }

 private:
  struct Block {
    std::vector<float> inv_rms;     // [B]
    Matrix normed, act, gelu_grad;  // [B, H], [B, F], [B, F] (GELU'(pre), kept for the backward)
  };
  void check(const CharLmWeights& weights, const CharBatch& batch,
             const CharLmWeights* grads) const;
  void resize(Index batch);
  void backward(const CharLmWeights& weights, const CharBatch& batch, CharLmWeights& grads,
                Compute& compute);

  CharLmConfig config_;
  Index batch_ = -1;
  Matrix x0_;                   // [B, C*E] concatenated embeddings
  std::vector<Matrix> stream_;  // L + 1 x [B, H]: residual stream before each block, and the last
  std::vector<Block> blocks_;   // L
  std::vector<float> final_inv_rms_;
  Matrix final_normed_;         // [B, H]
  Matrix probs_;                // [B, V]: logits, then (with grads) d(loss)/d(logits)
  Matrix d_stream_, d_normed_;  // [B, H]
  Matrix d_act_;                // [B, F]
  Matrix d_x0_;                 // [B, C*E]
};

}  // namespace distmuon
