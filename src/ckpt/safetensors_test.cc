// The safetensors layout: what encodeHeader writes decodes back, a header
// written by hand from the format's description parses, and every rule a
// reader holds a file to refuses what breaks it, naming the problem.
#include "ckpt/safetensors.h"

#include <gtest/gtest.h>

#include "common/endian.h"

namespace cistern::ckpt {
namespace {

// The header's JSON (what follows the 8-byte length).
std::string jsonOf(const std::string& file) { return file.substr(8); }

TEST(Safetensors, EncodedHeadersDecodeToTheSameTensors) {
  Header h;
  h.metadata = {{"format", "pt"}, {"cistern", "1"}};
  h.tensors = {{"w", DType::kF32, {2, 3}},
               {"b", DType::kBF16, {3}},
               {"step", DType::kI64, {}},
               {"empty", DType::kF16, {0, 4}},
               {"mask", DType::kBool, {5}},
               {"q", DType::kI8, {7}},
               {"layers.0.weight", DType::kF64, {1, 1, 2}}};
  auto bytes = encodeHeader(&h);
  ASSERT_TRUE(bytes.ok()) << bytes.status().toString();
  EXPECT_EQ(bytes->size() % 8, 0u);
  EXPECT_EQ(getLE<uint64_t>(*bytes, 0), bytes->size() - 8);
  // Back to back in the order given.
  EXPECT_EQ(h.tensors[0].begin, 0u);
  EXPECT_EQ(h.tensors[0].end, 24u);
  EXPECT_EQ(h.tensors[1].end, 30u);
  EXPECT_EQ(h.tensors[2].end, 38u);
  EXPECT_EQ(h.tensors[3].begin, h.tensors[3].end);
  auto n = decodeHeaderLength(*bytes, bytes->size() + h.dataBytes());
  ASSERT_TRUE(n.ok());
  auto back = decodeHeader(jsonOf(*bytes), h.dataBytes());
  ASSERT_TRUE(back.ok()) << back.status().toString();
  EXPECT_EQ(back->metadata, h.metadata);
  ASSERT_EQ(back->tensors.size(), h.tensors.size());
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const TensorInfo& b = back->tensors[i];
    const TensorInfo& want = h.tensors[i];
    if (want.begin == want.end) continue;  // empty ones may sort among each other
    EXPECT_EQ(b.name, want.name);
    EXPECT_EQ(b.dtype, want.dtype);
    EXPECT_EQ(b.shape, want.shape);
    EXPECT_EQ(b.begin, want.begin);
    EXPECT_EQ(b.end, want.end);
  }
}

TEST(Safetensors, AHeaderWrittenFromTheFormatsDescriptionParses) {
  std::string text =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I32","shape":[2,2],"data_offsets":[8,24]},)"
      R"("a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}   )";
  auto h = decodeHeader(text, 24);
  ASSERT_TRUE(h.ok()) << h.status().toString();
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->tensors[0].name, "a");  // by offset
  EXPECT_EQ(h->tensors[1].dtype, DType::kI32);
  EXPECT_EQ(h->tensors[1].shape, (std::vector<uint64_t>{2, 2}));
  EXPECT_EQ(h->metadata.at("format"), "pt");
}

TEST(Safetensors, EveryDTypeRoundTripsItsName) {
  for (auto d : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3,
                 DType::kF8E5M2, DType::kI64, DType::kI32, DType::kI16, DType::kI8, DType::kU64,
                 DType::kU32, DType::kU16, DType::kU8, DType::kBool}) {
    EXPECT_EQ(parseDType(dtypeName(d)), d) << dtypeName(d);
  }
  EXPECT_EQ(parseDType("F128"), std::nullopt);
  EXPECT_EQ(dtypeBytes(DType::kBF16), 2u);
  EXPECT_EQ(dtypeBytes(DType::kBool), 1u);
}

TEST(Safetensors, BrokenHeadersAreRefusedNamingTheProblem) {
  struct Case {
    std::string json;
    uint64_t data;
    std::string names;
  };
  const std::string i32 = R"({"t":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})";
  for (const Case& c : std::vector<Case>{
           {"", 0, "start"},
           {"[1,2]", 0, "start"},
           {"{\"t\":", 0, "JSON"},
           {i32, 16, "cover 8 bytes of a buffer of 16"},
           {R"({"t":{"dtype":"I33","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype"},
           {R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8, "no dtype"},
           {R"({"t":{"dtype":"I32","data_offsets":[0,8]}})", 8, "no shape"},
           {R"({"t":{"dtype":"I32","shape":[-2],"data_offsets":[0,8]}})", 8, "whole number"},
           {R"({"t":{"dtype":"I32","shape":[2.5],"data_offsets":[0,8]}})", 8, "whole number"},
           {R"({"t":{"dtype":"I32","shape":[2],"data_offsets":[0]}})", 8, "data_offsets"},
           {R"({"t":{"dtype":"I32","shape":[2],"data_offsets":[8,0]}})", 8, "end before"},
           {R"({"t":{"dtype":"I32","shape":[3],"data_offsets":[0,8]}})", 8, "12 bytes"},
           {R"({"t":{"dtype":"U8","shape":[4294967296,4294967296,2],"data_offsets":[0,8]}})", 8,
            "too many"},
           {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
            6, "overlaps"},
           {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8, "hole"},
           {R"({"__metadata__":{"n":1}})", 0, "not a string"},
           {R"({"__metadata__":[]})", 0, "not an object"},
           {R"({"t":7})", 0, "not an object"},
       }) {
    auto h = decodeHeader(c.json, c.data);
    ASSERT_FALSE(h.ok()) << c.json;
    EXPECT_EQ(h.code(), ErrorCode::kCorruption) << c.json;
    EXPECT_NE(h.status().toString().find(c.names), std::string::npos)
        << c.json << ": " << h.status().toString();
  }
}

TEST(Safetensors, TheLengthIsBoundedByTheLimitAndTheFile) {
  std::string b;
  appendLE<uint64_t>(b, 64);
  EXPECT_TRUE(decodeHeaderLength(b, 72).ok());
  EXPECT_EQ(decodeHeaderLength(b, 71).code(), ErrorCode::kCorruption);
  EXPECT_EQ(decodeHeaderLength("1234567", 100).code(), ErrorCode::kCorruption);
  std::string big;
  appendLE<uint64_t>(big, kHeaderBytesMax + 1);
  EXPECT_EQ(decodeHeaderLength(big, UINT64_MAX).code(), ErrorCode::kCorruption);
}

TEST(Safetensors, BadNamesAndSizesAreRefusedWhenWriting) {
  for (std::vector<TensorInfo> ts : std::vector<std::vector<TensorInfo>>{
           {{"", DType::kU8, {1}}},
           {{"__metadata__", DType::kU8, {1}}},
           {{"x", DType::kU8, {1}}, {"x", DType::kU8, {2}}},
           {{"x", DType::kF64, {UINT64_MAX / 4}}},
       }) {
    Header h;
    h.tensors = ts;
    EXPECT_EQ(encodeHeader(&h).code(), ErrorCode::kInvalidArgument) << ts[0].name;
  }
}

}  // namespace
}  // namespace cistern::ckpt
