#include "data/tokenizer.h"

#include "core/error.h"
#include "data/bpe.h"

namespace mt {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, Special) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    MT_CHECK(ids[i] >= 0 && ids[i] < 256, "bytes tokenizer: decode: id ", ids[i], " at position ",
             i, " is not a byte (0 .. 255)");
    out[i] = static_cast<char>(ids[i]);
  }
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name, const std::string& gpt2_dir) {
  if (name == "bytes") return std::make_unique<ByteTokenizer>();
  if (name == "gpt2")
    return std::make_unique<Gpt2Tokenizer>(gpt2_dir + "/encoder.json", gpt2_dir + "/vocab.bpe");
  MT_THROW("unknown tokenizer '", name, "': the tokenizers are bytes and gpt2");
}

}  // namespace mt
