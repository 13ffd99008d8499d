#include "runtime/text/vocab_builder.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>

#include "format/error.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/pretokenizer.h"
#include "runtime/text/sample_text.h"
#include "runtime/text/unicode.h"

namespace tessera::text {

namespace {

// Upper bound on learned merges: the sample is small, so training usually stops earlier (when no
// pair occurs twice); the bound keeps build time flat whatever the vocab size.
constexpr size_t kMaxMerges = 4000;

struct TrainedMerges {
  std::vector<std::string> merges;      // "left right", in training order (= rank)
  std::vector<std::string> new_tokens;  // per merge: the token it adds, or "" if it already existed
};

// Byte-level BPE training over the pre-tokenized sample: count adjacent symbol pairs over all
// pieces (weighted by how often the piece occurs), merge the most frequent pair everywhere,
// repeat. Ties go to the lexicographically smallest (left, right) pair, so training is
// deterministic. Stops after kMaxMerges merges or when no pair occurs at least twice.
TrainedMerges train_merges(std::string_view pre) {
  const PreTokenizer pretok = PreTokenizer::for_name(pre);
  std::map<std::string_view, int64_t> piece_counts;
  for (std::string_view piece : pretok.split(bpe_training_sample())) ++piece_counts[piece];

  std::vector<std::string> text_of(byte_symbols().begin(), byte_symbols().end());  // symbol id -> text
  std::unordered_map<std::string, int32_t> id_of;
  for (int32_t b = 0; b < 256; ++b) id_of.emplace(text_of[b], b);

  struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [piece, count] : piece_counts) {
    Word w{{}, count};
    for (char c : piece) w.symbols.push_back(static_cast<uint8_t>(c));  // byte b has symbol id b
    if (w.symbols.size() >= 2) words.push_back(std::move(w));
  }

  TrainedMerges out;
  std::unordered_map<uint64_t, int64_t> pair_counts;
  const auto key = [](int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); };
  while (out.merges.size() < kMaxMerges) {
    pair_counts.clear();
    for (const Word& w : words)
      for (size_t i = 0; i + 1 < w.symbols.size(); ++i) pair_counts[key(w.symbols[i], w.symbols[i + 1])] += w.count;

    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [k, count] : pair_counts) {
      if (count < best_count) continue;
      if (count == best_count) {
        const auto pair_of = [&](uint64_t p) {
          return std::pair<const std::string&, const std::string&>(text_of[p >> 32], text_of[p & 0xFFFFFFFFu]);
        };
        if (!(pair_of(k) < pair_of(best))) continue;
      }
      best = k;
      best_count = count;
    }
    if (best_count < 2) break;

    const int32_t left = static_cast<int32_t>(best >> 32), right = static_cast<int32_t>(best & 0xFFFFFFFFu);
    std::string merged = text_of[left] + text_of[right];
    out.merges.push_back(text_of[left] + " " + text_of[right]);
    int32_t merged_id;
    if (auto it = id_of.find(merged); it != id_of.end()) {
      merged_id = it->second;
      out.new_tokens.emplace_back();
    } else {
      merged_id = static_cast<int32_t>(text_of.size());
      id_of.emplace(merged, merged_id);
      text_of.push_back(merged);
      out.new_tokens.push_back(std::move(merged));
    }
    for (Word& w : words) {  // replace non-overlapping occurrences, left to right
      std::vector<int32_t>& s = w.symbols;
      size_t dst = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          s[dst++] = merged_id;
          ++i;
        } else {
          s[dst++] = s[i];
        }
      }
      s.resize(dst);
    }
  }
  return out;
}

// Training runs once per pre-tokenizer and process.
const TrainedMerges& cached_merges(const std::string& pre) {
  static std::mutex mutex;
  static std::map<std::string, TrainedMerges> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(pre);
  if (it == cache.end()) it = cache.emplace(pre, train_merges(pre)).first;
  return it->second;
}

struct SpecialToken {
  const char* text;
  int32_t type;
};

// GLM-4.x special block (60 slots; ids from the block start). Role and framing tokens are
// CONTROL: they are matched in prompts only when special tokens are parsed and rendered only on
// request. The reasoning/tool markup tokens are USER_DEFINED, as non-special added tokens of the
// HF tokenizer become in GGUF: always matched, always rendered, so `<think>` and `<tool_call>`
// survive into decoded text where chat front-ends parse them.
constexpr SpecialToken kGlm4Specials[] = {
    {"<|endoftext|>", kTokenControl},    {"[MASK]", kTokenControl},          {"[gMASK]", kTokenControl},
    {"[sMASK]", kTokenControl},          {"<sop>", kTokenControl},           {"<eop>", kTokenControl},
    {"<|system|>", kTokenControl},       {"<|user|>", kTokenControl},        {"<|assistant|>", kTokenControl},
    {"<|observation|>", kTokenControl},  {"<think>", kTokenUserDefined},     {"</think>", kTokenUserDefined},
    {"<tool_call>", kTokenUserDefined},  {"</tool_call>", kTokenUserDefined}, {"<arg_key>", kTokenUserDefined},
    {"</arg_key>", kTokenUserDefined},   {"<arg_value>", kTokenUserDefined}, {"</arg_value>", kTokenUserDefined},
    {"<tool_response>", kTokenUserDefined}, {"</tool_response>", kTokenUserDefined},
};
constexpr uint32_t kGlm4BlockSlots = 60;

// DeepSeek-LLM special block (16 slots): sentence markers and fill-in-the-middle markers.
constexpr SpecialToken kDeepseekSpecials[] = {
    {"<｜begin▁of▁sentence｜>", kTokenControl}, {"<｜end▁of▁sentence｜>", kTokenControl},
    {"<｜fim▁hole｜>", kTokenControl},           {"<｜fim▁begin｜>", kTokenControl},
    {"<｜fim▁end｜>", kTokenControl},
};
constexpr uint32_t kDeepseekBlockSlots = 16;
constexpr uint32_t kDeepseekRealVocab = 102400, kDeepseekRealBlockStart = 100000;

}  // namespace

std::vector<std::string> synthetic_vocab_flavors() { return {"glm4", "deepseek-llm"}; }

VocabArrays build_synthetic_vocab(std::string_view flavor, uint32_t vocab_size) {
  const bool glm = flavor == "glm4";
  if (!glm && flavor != "deepseek-llm")
    usage_error("synthetic vocab: unknown flavor \"", flavor, "\" (expected glm4 or deepseek-llm)");
  const uint32_t slots = glm ? kGlm4BlockSlots : kDeepseekBlockSlots;
  if (vocab_size < 256 + slots)
    usage_error("synthetic vocab (", flavor, "): vocab_size ", vocab_size, " is too small; need at least ",
                256 + slots, " (256 byte tokens + ", slots, " special slots)");
  const uint32_t block_start =
      (!glm && vocab_size == kDeepseekRealVocab) ? kDeepseekRealBlockStart : vocab_size - slots;

  VocabArrays v;
  v.pre = std::string(flavor);
  v.tokens.reserve(vocab_size);
  v.token_types.reserve(vocab_size);
  for (const std::string& s : byte_symbols()) {
    v.tokens.push_back(s);
    v.token_types.push_back(kTokenNormal);
  }
  const TrainedMerges& trained = cached_merges(v.pre);
  for (size_t i = 0; i < trained.merges.size(); ++i) {
    const std::string& added = trained.new_tokens[i];
    if (!added.empty()) {
      if (v.tokens.size() >= block_start) break;  // normal-token budget used up
      v.tokens.push_back(added);
      v.token_types.push_back(kTokenNormal);
    }
    v.merges.push_back(trained.merges[i]);
  }
  const auto pad_to = [&](uint32_t end) {
    while (v.tokens.size() < end) {
      v.tokens.push_back(cat("[PAD", v.tokens.size(), "]"));
      v.token_types.push_back(kTokenUnused);
    }
  };
  pad_to(block_start);
  const auto add_specials = [&](const auto& list) {
    for (const SpecialToken& s : list) {
      v.tokens.emplace_back(s.text);
      v.token_types.push_back(s.type);
    }
  };
  const int32_t b = static_cast<int32_t>(block_start);
  if (glm) {
    add_specials(kGlm4Specials);
    v.eos = b + 0;  // <|endoftext|>
    v.bos = b + 2;  // [gMASK]
    v.eot = b + 7;  // <|user|>
    v.eom = b + 9;  // <|observation|>
    v.unk = v.eos;
    v.pad = v.eos;
    v.add_bos = false;  // the chat template writes [gMASK]<sop> itself
    v.chat_template = std::string(builtin_chat_template(ChatFormat::Glm4));
  } else {
    add_specials(kDeepseekSpecials);
    v.bos = b + 0;
    v.eos = b + 1;
    v.pad = v.eos;
    v.add_bos = true;
    v.chat_template = std::string(builtin_chat_template(ChatFormat::DeepSeekV2));
  }
  pad_to(vocab_size);
  return v;
}

void write_vocab(const VocabArrays& vocab, Metadata& md) {
  md.set_string("tokenizer.ggml.model", vocab.model);
  md.set_string("tokenizer.ggml.pre", vocab.pre);
  md.set_string_array("tokenizer.ggml.tokens", vocab.tokens);
  md.set_i32_array("tokenizer.ggml.token_type", vocab.token_types);
  md.set_string_array("tokenizer.ggml.merges", vocab.merges);
  const std::pair<const char*, int32_t> ids[] = {
      {"tokenizer.ggml.bos_token_id", vocab.bos},     {"tokenizer.ggml.eos_token_id", vocab.eos},
      {"tokenizer.ggml.eot_token_id", vocab.eot},     {"tokenizer.ggml.eom_token_id", vocab.eom},
      {"tokenizer.ggml.unknown_token_id", vocab.unk}, {"tokenizer.ggml.padding_token_id", vocab.pad},
  };
  for (const auto& [key, id] : ids)
    if (id >= 0) md.set_u32(key, static_cast<uint32_t>(id));
  md.set_bool("tokenizer.ggml.add_bos_token", vocab.add_bos);
  md.set_bool("tokenizer.ggml.add_eos_token", false);
  if (!vocab.chat_template.empty()) md.set_string("tokenizer.chat_template", vocab.chat_template);
}

}  // namespace tessera::text
