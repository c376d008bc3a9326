// RoPE inverse frequencies against values computed outside this code base: Hugging Face's
// published Llama-3 formula (transformers' _compute_llama3_parameters) for the
// Llama-3.1-8B configuration (theta 500000, head_dim 128, factor 8, low_freq_factor 1,
// high_freq_factor 4, original_max_position_embeddings 8192), evaluated in float64 by a
// separate Python script and pasted here. Indices 29-34 are the middle band, where the
// smoothing weights blend the scaled and unscaled frequencies.
#include <cmath>
#include <utility>
#include <vector>

#include "common/model_config.h"
#include "gtest/gtest.h"

namespace lazykv {
namespace {

RopeConfig Llama31Rope() {
  RopeConfig rope;
  rope.style = RopeStyle::kRotateHalf;
  rope.theta = 500000.0;
  rope.llama3_scaling = true;
  rope.scaling_factor = 8.0;
  rope.low_freq_factor = 1.0;
  rope.high_freq_factor = 4.0;
  rope.original_max_position = 8192.0;
  return rope;
}

TEST(RopeFrequenciesTest, Llama31MatchesHuggingFaceValuesInEveryBand) {
  const std::vector<std::pair<int, double>> expected = {
      {0, 1.0},                      // high band: unchanged
      {1, 0.8146172338565447},       //
      {20, 0.016560440080994446},    //
      {28, 0.0032114459947525913},   // the last high-band index
      {29, 0.002166570763503359},    // middle band: blended
      {30, 0.0013718935677611381},   //
      {31, 0.0008567514129196321},   //
      {32, 0.0005248461609929547},   //
      {33, 0.00031269375038406517},  //
      {34, 0.00017850781276799638},  //
      {35, 9.556212353964683e-05},   // low band: divided by the factor
      {40, 3.428102195952591e-05},   //
      {50, 4.411534674558404e-06},   //
      {63, 3.068925988914511e-07},   //
  };
  const std::vector<double> inv = RopeInverseFrequencies(Llama31Rope(), 128);
  ASSERT_EQ(inv.size(), 64u);
  for (const auto& [i, value] : expected) {
    EXPECT_NEAR(inv[i], value, 1e-12 * value) << "index " << i;
  }
}

TEST(RopeFrequenciesTest, PlainRopeIsThetaToTheMinusTwoIOverD) {
  RopeConfig rope;
  rope.theta = 10000.0;
  const std::vector<double> inv = RopeInverseFrequencies(rope, 64);
  ASSERT_EQ(inv.size(), 32u);
  // 10000^(-2i/64), from the definition: i = 0, 1, 16, 31.
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_NEAR(inv[1], 0.7498942093324559, 1e-15);
  EXPECT_NEAR(inv[16], 0.01, 1e-17);
  EXPECT_NEAR(inv[31], 1.333521432163324e-04, 1e-18);
}

}  // namespace
}  // namespace lazykv
