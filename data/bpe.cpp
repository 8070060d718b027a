#include "data/bpe.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "core/input_file.h"
#include "data/unicode_tables.h"

namespace mt {
namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

// ---- UTF-8 ----------------------------------------------------------------------------------

// The length of the well-formed UTF-8 sequence at s[i], or 0 if there is none there: exactly what
// Python's strict decoder accepts (no overlong forms, no surrogates, nothing past U+10FFFF).
int utf8_length(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  const unsigned b0 = byte(i);
  if (b0 < 0x80) return 1;
  auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    const unsigned b = byte(k);
    return k < s.size() && b >= lo && b <= hi;
  };
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    // E0 would be overlong below A0; ED A0..BF would be a surrogate (U+D800..DFFF).
    const unsigned lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    // F0 would be overlong below 90; F4 90.. is past U+10FFFF.
    const unsigned lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

char32_t utf8_value(std::string_view s, size_t i, int len) {
  static constexpr unsigned kLeadMask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  char32_t cp = static_cast<unsigned char>(s[i]) & kLeadMask[len];
  for (int k = 1; k < len; ++k) cp = cp << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

std::string hex_byte(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", unsigned(b));
  return buf;
}

[[noreturn]] void throw_bad_utf8(std::string_view text, size_t i) {
  const auto line = 1 + std::count(text.begin(), text.begin() + std::ptrdiff_t(i), '\n');
  MT_THROW("gpt2 tokenizer: the text is not valid UTF-8: byte ", hex_byte(text[i]),
           " at byte offset ", i, " (line ", line,
           ") does not begin a well-formed UTF-8 character. GPT-2's tokenizer reads Unicode text; "
           "the bytes tokenizer takes any bytes");
}

// ---- the pre-tokenizer's character classes --------------------------------------------------

enum class CharClass : uint8_t { space, letter, number, other };

// Unicode's White_Space property (PropList.txt; unchanged since Unicode 6.3): the regex module's
// \s. Python's str.isspace() would add U+001C..001F, which \s does not match.
constexpr char32_t kWhiteSpace[] = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680,
                                    0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006,
                                    0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F,
                                    0x205F, 0x3000};

template <size_t N>
bool in_ranges(const unicode::CodePointRange (&ranges)[N], char32_t cp) {
  const auto* it =
      std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                       [](char32_t c, const unicode::CodePointRange& r) { return c < r.first; });
  return it != std::begin(ranges) && cp <= (it - 1)->last;
}

CharClass classify_slow(char32_t cp) {
  if (std::find(std::begin(kWhiteSpace), std::end(kWhiteSpace), cp) != std::end(kWhiteSpace))
    return CharClass::space;
  if (in_ranges(unicode::kLetterRanges, cp)) return CharClass::letter;
  if (in_ranges(unicode::kNumberRanges, cp)) return CharClass::number;
  return CharClass::other;
}

// Most text is ASCII: its classes come from a table.
const std::array<CharClass, 128> kAsciiClass = [] {
  std::array<CharClass, 128> t{};
  for (char32_t c = 0; c < 128; ++c) t[c] = classify_slow(c);
  return t;
}();

struct Char {
  CharClass cls;
  int len;  // bytes
};

// The class and length of the character at s[i] (i < s.size()); throws for bad UTF-8.
Char char_at(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return {kAsciiClass[b], 1};
  const int len = utf8_length(s, i);
  if (len == 0) throw_bad_utf8(s, i);
  return {classify_slow(utf8_value(s, i, len)), len};
}

// The end of the piece that starts at s[i], in a text that ends at s[n]: GPT-2's regex,
// alternative by alternative. (s goes on past n where encode() stops at a special token; no
// character crosses n, which is a '<'.)
size_t piece_end(std::string_view s, size_t i, size_t n) {
  // 's|'t|'re|'ve|'m|'ll|'d
  if (s[i] == '\'' && i + 1 < n) {
    const char c = s[i + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
    const std::string_view two = s.substr(i + 1, std::min<size_t>(2, n - i - 1));
    if (two == "re" || two == "ve" || two == "ll") return i + 3;
  }
  // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: a space joins the run of the class that follows it.
  size_t k = i;
  CharClass cls = char_at(s, i).cls;
  if (s[i] == ' ' && i + 1 < n) {
    const CharClass next = char_at(s, i + 1).cls;
    if (next != CharClass::space) cls = next, k = i + 1;
  }
  if (cls != CharClass::space) {
    while (k < n) {
      const Char c = char_at(s, k);
      if (c.cls != cls) break;
      k += size_t(c.len);
    }
    return k;
  }
  // `\s+(?!\S)|\s+`: the whole run at the end of the text or when it is one character long;
  // otherwise all but its last character, which begins the next piece.
  size_t last = i;
  while (k < n) {
    const Char c = char_at(s, k);
    if (c.cls != CharClass::space) break;
    last = k;
    k += size_t(c.len);
  }
  return k == n || last == i ? k : last;
}

// f(piece) for each piece of text[begin, end), in order.
template <class F>
void for_each_piece(std::string_view text, size_t begin, size_t end, F&& f) {
  for (size_t i = begin; i < end;) {
    const size_t stop = piece_end(text, i, end);
    f(text.substr(i, stop - i));
    i = stop;
  }
}

// ---- the byte alphabet ----------------------------------------------------------------------

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100 onwards, in byte order.
const std::array<char32_t, 256> kByteChar = [] {
  std::array<char32_t, 256> t{};
  char32_t next = 0x100;
  for (unsigned b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    t[b] = printable ? char32_t(b) : next++;
  }
  return t;
}();

std::string read_file(const std::string& path, const char* what) {
  try {
    return read_regular_file(path);  // a FIFO must not hang the tokenizer's construction
  } catch (const Error& e) {
    MT_THROW(path, ": cannot open GPT-2's ", what, " (", e.what(), ")");
  }
}

// A token as the vocabulary spells it (byte alphabet) -> its bytes; throws naming the token.
std::string token_to_bytes(const std::string& token, const std::string& path) {
  static const std::vector<int> byte_of_char = [] {
    std::vector<int> t(0x144, -1);
    for (unsigned b = 0; b < 256; ++b) t[kByteChar[b]] = int(b);
    return t;
  }();
  MT_CHECK(!token.empty(), path, ": the empty string is not a token");
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    const int len = utf8_length(token, i);
    MT_CHECK(len > 0, path, ": token \"", token, "\" is not valid UTF-8");
    const char32_t cp = utf8_value(token, i, len);
    MT_CHECK(cp < byte_of_char.size() && byte_of_char[cp] >= 0, path, ": token \"", token,
             "\" has a character (U+", std::hex, uint32_t(cp), std::dec,
             ") outside GPT-2's byte alphabet");
    bytes += char(byte_of_char[cp]);
    i += size_t(len);
  }
  return bytes;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return uint64_t(uint32_t(left)) << 32 | uint32_t(right);
}

}  // namespace

std::vector<std::string_view> gpt2_split(std::string_view text) {
  std::vector<std::string_view> pieces;
  for_each_piece(text, 0, text.size(), [&](std::string_view p) { pieces.push_back(p); });
  return pieces;
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& encoder_json, const std::string& vocab_bpe) {
  // encoder.json: {"token": id, ...}
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_file(encoder_json, "vocabulary (encoder.json)"));
  } catch (const nlohmann::json::exception& e) {
    MT_THROW(encoder_json, ": not GPT-2's vocabulary: not valid JSON: ", e.what());
  }
  MT_CHECK(vocab.is_object() && !vocab.empty(), encoder_json,
           ": not GPT-2's vocabulary: expected a JSON object of token -> id");
  const size_t size = vocab.size();
  std::unordered_map<std::string, int32_t> id_of;  // the token's spelling in the byte alphabet
  token_bytes_.assign(size, {});
  std::vector<bool> seen(size, false);
  for (const auto& [token, value] : vocab.items()) {
    MT_CHECK(value.is_number_integer() && value.get<int64_t>() >= 0 &&
                 value.get<int64_t>() < int64_t(size),
             encoder_json, ": token \"", token, "\" has id ", value.dump(),
             "; the ids must be the integers 0 .. ", size - 1);
    const auto id = value.get<int32_t>();
    MT_CHECK(!seen[size_t(id)], encoder_json, ": id ", id,
             " is given to two tokens, one of them \"", token, "\"");
    seen[size_t(id)] = true;
    token_bytes_[size_t(id)] = token_to_bytes(token, encoder_json);
    id_of.emplace(token, id);
  }
  for (unsigned b = 0; b < 256; ++b) {
    std::string spelled;
    const char32_t cp = kByteChar[b];
    // kByteChar is below U+0800: one or two UTF-8 bytes.
    if (cp < 0x80) spelled = char(cp);
    else spelled = {char(0xC0 | cp >> 6), char(0x80 | (cp & 0x3F))};
    const auto it = id_of.find(spelled);
    MT_CHECK(it != id_of.end(), encoder_json, ": no token for byte ", hex_byte(b), " (\"", spelled,
             "\"); a byte-level vocabulary has one for each of the 256 bytes");
    byte_token_[b] = it->second;
  }
  const auto eot = id_of.find(std::string(kEndOfText));
  MT_CHECK(eot != id_of.end(), encoder_json, ": no \"", kEndOfText, "\" token");
  end_of_text_ = eot->second;

  // vocab.bpe: "#version: 0.2", then "left right" per line, in rank order.
  const std::string text = read_file(vocab_bpe, "merges (vocab.bpe)");
  std::istringstream lines(text);
  std::string line;
  MT_CHECK(std::getline(lines, line) && line.starts_with("#version"), vocab_bpe,
           ": not GPT-2's merges: line 1 should be the \"#version: ...\" header");
  // A merge may only use tokens that exist by then: single bytes or an earlier merge's result.
  // That is how BPE learns its merges, and it makes every pair a merge creates rank after the
  // merge that created it, which is what lets merge_piece take pairs from a heap.
  std::vector<bool> made(size, false);
  for (int32_t id : byte_token_) made[size_t(id)] = true;
  for (int64_t number = 2; std::getline(lines, line); ++number) {
    const size_t space = line.find(' ');
    MT_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                 line.find(' ', space + 1) == std::string::npos,
             vocab_bpe, ": line ", number, " (\"", line,
             "\") is not a merge: expected two tokens separated by one space");
    const std::string left = line.substr(0, space), right = line.substr(space + 1);
    int32_t ids[2];
    for (int side = 0; side < 2; ++side) {
      const std::string& tok = side == 0 ? left : right;
      const auto it = id_of.find(tok);
      MT_CHECK(it != id_of.end(), vocab_bpe, ": line ", number, ": token \"", tok, "\" is not in ",
               encoder_json);
      MT_CHECK(made[size_t(it->second)], vocab_bpe, ": line ", number, ": token \"", tok,
               "\" is used before any merge makes it");
      ids[side] = it->second;
    }
    const auto merged = id_of.find(left + right);
    MT_CHECK(merged != id_of.end(), vocab_bpe, ": line ", number, ": the merged token \"",
             left + right, "\" is not in ", encoder_json);
    MT_CHECK(!made[size_t(merged->second)], vocab_bpe, ": line ", number, ": \"", left + right,
             "\" is made twice (a byte or an earlier merge already makes it)");
    made[size_t(merged->second)] = true;
    merges_.emplace(pair_key(ids[0], ids[1]), Merge{int32_t(merges_.size()), merged->second});
  }
}

void Gpt2Tokenizer::merge_piece(std::string_view piece, std::vector<int32_t>& out) const {
  // The piece's symbols as a linked list over their first byte's index; a merge keeps the left
  // symbol and unlinks the right one.
  MT_CHECK(piece.size() < size_t(std::numeric_limits<int32_t>::max()), "gpt2: one piece of ",
           piece.size(), " bytes (an unbroken run of letters, digits, symbols or spaces) is more "
           "than the 2^31 - 1 bytes a piece may have");
  const auto n = int32_t(piece.size());
  struct Symbol {
    int32_t id, prev, next;  // next == n: the last symbol; id == -1: merged away
  };
  std::vector<Symbol> sym(piece.size());
  for (int32_t i = 0; i < n; ++i)
    sym[size_t(i)] = {byte_token_[static_cast<unsigned char>(piece[size_t(i)])], i - 1, i + 1};

  // Candidate merges, lowest rank first and, within a rank, leftmost first: GPT-2's "every
  // occurrence left to right". A candidate is stale once either symbol has changed.
  struct Candidate {
    int32_t rank, left, left_id, right_id, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t left) {
    if (left < 0 || sym[size_t(left)].next >= n) return;
    const int32_t a = sym[size_t(left)].id, b = sym[size_t(sym[size_t(left)].next)].id;
    const auto it = merges_.find(pair_key(a, b));
    if (it != merges_.end()) heap.push({it->second.rank, left, a, b, it->second.id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[size_t(c.left)];
    if (left.id != c.left_id || left.next >= n || sym[size_t(left.next)].id != c.right_id) continue;
    Symbol& right = sym[size_t(left.next)];
    left.id = c.merged;
    right.id = -1;
    left.next = right.next;
    if (left.next < n) sym[size_t(left.next)].prev = c.left;
    push(left.prev);
    push(c.left);
  }
  for (int32_t i = 0; i < n; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text, Special special) const {
  // Each distinct piece's tokens, kept in `tokens` as [begin, end) and keyed by views into text.
  struct Span {
    size_t begin, end;
  };
  std::unordered_map<std::string_view, Span> cache;
  std::vector<int32_t> tokens, out;
  out.reserve(text.size() / 3);
  auto encode_piece = [&](std::string_view piece) {
    auto [it, fresh] = cache.try_emplace(piece);
    if (fresh) {
      const size_t begin = tokens.size();
      merge_piece(piece, tokens);
      it->second = {begin, tokens.size()};
    }
    out.insert(out.end(), tokens.begin() + std::ptrdiff_t(it->second.begin),
               tokens.begin() + std::ptrdiff_t(it->second.end));
  };
  if (special == Special::as_text) {
    for_each_piece(text, 0, text.size(), encode_piece);
    return out;
  }
  for (size_t at = 0;;) {
    const size_t found = std::min(text.find(kEndOfText, at), text.size());
    for_each_piece(text, at, found, encode_piece);
    if (found == text.size()) return out;
    out.push_back(end_of_text_);
    at = found + kEndOfText.size();
  }
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    MT_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), "gpt2 tokenizer: decode: id ", ids[i],
             " at position ", i, " is outside the vocabulary (0 .. ", vocab_size() - 1, ")");
    out += token_bytes_[size_t(ids[i])];
  }
  return out;
}

}  // namespace mt
