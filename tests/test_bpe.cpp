// The tokenizers (data/tokenizer.h, data/bpe.h): GPT-2's BPE against the tokens GPT-2's own
// encoder gives (the expected ids below are its output), round trips, the pre-tokenizer's pieces,
// the merge order on a small vocabulary, and a clear mt::Error for bad text and bad files.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>

#include "core/error.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "tests/expect_error.h"
#include "tests/temp_dir.h"

using namespace mt;
using mt::test::expect_error;
using mt::test::TempDir;

namespace {

const std::string kGpt2Dir = std::string(MT_SOURCE_DIR) + "/assets/gpt2";

// Loaded once: every test shares it, as threads of a program may.
const Gpt2Tokenizer& gpt2() {
  static const Gpt2Tokenizer tok(kGpt2Dir + "/encoder.json", kGpt2Dir + "/vocab.bpe");
  return tok;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string& shakespeare() {
  static const std::string text = read_text(std::string(MT_SOURCE_DIR) + "/assets/tinyshakespeare.txt");
  return text;
}

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : gpt2_split(text)) out.emplace_back(p);
  return out;
}

// Strings the pre-tokenizer and the merges must get right, with GPT-2's pieces and tokens.
struct Case {
  std::string text;
  std::vector<std::string> pieces;
  std::vector<int32_t> ids;
};

const std::vector<Case>& tricky_cases() {
  static const std::vector<Case> cases = {
      {"I'm sure they'll say it's 'S and we've we'd you're I'LL",
       {"I", "'m", " sure", " they", "'ll", " say", " it", "'s", " '", "S", " and", " we", "'ve",
        " we", "'d", " you", "'re", " I", "'", "LL"},
       {40, 1101, 1654, 484, 1183, 910, 340, 338, 705, 50, 290, 356, 1053, 356, 1549, 345, 821,
        314, 6, 3069}},
      {"12345 6789 x1y2 3.14",
       {"12345", " 6789", " x", "1", "y", "2", " 3", ".", "14"},
       {10163, 2231, 718, 40401, 2124, 16, 88, 17, 513, 13, 1415}},
      {"a   b\t\tc  \n\n\nd \n",
       {"a", "  ", " b", "\t", "\t", "c", "  \n\n", "\n", "d", " \n"},
       {64, 220, 220, 275, 197, 197, 66, 220, 220, 628, 198, 67, 220, 198}},
      {"naïve café Straße 東京タワー ΑΒΓ",
       {"naïve", " café", " Straße", " 東京タワー", " ΑΒΓ"},
       {2616, 38776, 40304, 15195, 39683, 68, 10545, 251, 109, 12859, 105, 23376, 25589, 6312,
        7377, 239, 138, 240, 138, 241}},
      {"emoji 🙂👍🏽 done",
       {"emoji", " 🙂👍🏽", " done"},
       {368, 31370, 32485, 41840, 235, 8582, 237, 121, 1760}},
      {"trailing spaces   ", {"trailing", " spaces", "   "}, {9535, 4386, 9029, 220, 220, 220}},
      {"  leading", {" ", " leading"}, {220, 3756}},
      {"''s!!'s ?!  ...",
       {"''", "s", "!!'", "s", " ?!", " ", " ..."},
       {7061, 82, 3228, 6, 82, 5633, 0, 220, 2644}},
      {"Ⅻ ½ ٣", {"Ⅻ", " ½", " ٣"}, {158, 227, 104, 25208, 18923, 96}},
      // Letters and numbers beyond Latin-1 next to punctuation and to each other.
      {"東京!ΑΒΓ? ٣٤x Ⅻ.ǅa",
       {"東京", "!", "ΑΒΓ", "?", " ٣٤", "x", " Ⅻ", ".", "ǅa"},
       {30266, 109, 12859, 105, 0, 138, 239, 138, 240, 138, 241, 30, 18923, 96, 149, 97, 87, 2343,
        227, 104, 13, 131, 227, 64}},
  };
  return cases;
}

}  // namespace

TEST(Gpt2Tokenizer, EncodesHelloWorldAsGpt2Does) {
  EXPECT_EQ(gpt2().encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().merge_count(), 50000);
  EXPECT_EQ(gpt2().end_of_text(), 50256);
}

// The whole corpus as one string: GPT-2's count and first tokens, the time it takes, and back.
TEST(Gpt2Tokenizer, EncodesTinyShakespeareAsGpt2Does) {
  const std::string& text = shakespeare();
  ASSERT_EQ(text.size(), 1115394u);
  // CPU time, not wall time: a busy machine slows the wall clock, not the work.
  const std::clock_t start = std::clock();
  const std::vector<int32_t> ids = gpt2().encode(text);
  const double seconds = double(std::clock() - start) / CLOCKS_PER_SEC;
  std::cout << "encoded tinyshakespeare (" << text.size() << " bytes) in " << seconds
            << " s of CPU time: " << text.size() / seconds / 1e6 << " MB/s\n";
  ASSERT_EQ(ids.size(), 338025u);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 12),
            (std::vector<int32_t>{5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11, 3285, 502}));
  EXPECT_EQ(gpt2().decode(ids), text);
}

TEST(Gpt2Tokenizer, TrickyStringsSplitAndEncodeAsGpt2Does) {
  for (const Case& c : tricky_cases()) {
    SCOPED_TRACE(c.text);
    EXPECT_EQ(split(c.text), c.pieces);
    EXPECT_EQ(gpt2().encode(c.text), c.ids);
    EXPECT_EQ(gpt2().decode(c.ids), c.text);
  }
}

// Pieces at the edges: an empty text, a lone space, whitespace the regex's \s includes (U+00A0,
// U+3000) or not (U+001F is "other", though Python's isspace() says it is a space).
TEST(Gpt2Tokenizer, SplitsAtTheEdges) {
  EXPECT_TRUE(gpt2().encode("").empty());
  EXPECT_TRUE(split("").empty());
  EXPECT_EQ(split(" "), (std::vector<std::string>{" "}));
  EXPECT_EQ(split("x\n"), (std::vector<std::string>{"x", "\n"}));
  // Only U+0020 joins the piece after it; another space character stands alone before a letter.
  EXPECT_EQ(split("a\xC2\xA0\xC2\xA0" "b"),
            (std::vector<std::string>{"a", "\xC2\xA0", "\xC2\xA0", "b"}));
  EXPECT_EQ(split("a\xE3\x80\x80" "b"), (std::vector<std::string>{"a", "\xE3\x80\x80", "b"}));
  EXPECT_EQ(split("a \x1f\x1f" "b"), (std::vector<std::string>{"a", " \x1f\x1f", "b"}));
  EXPECT_EQ(split("a\xC2\x85\xC2\x85" "b"),  // U+0085 is \s
            (std::vector<std::string>{"a", "\xC2\x85", "\xC2\x85", "b"}));
  EXPECT_EQ(split("'"), (std::vector<std::string>{"'"}));
  EXPECT_EQ(split("x'r"), (std::vector<std::string>{"x", "'", "r"}));
  EXPECT_EQ(split("x're"), (std::vector<std::string>{"x", "'re"}));
}

TEST(Gpt2Tokenizer, RoundTripsEveryByteValueOfValidUtf8) {
  // Control characters, the characters behind GPT-2's remapped bytes, 2-, 3- and 4-byte UTF-8.
  std::string text;
  for (int c = 0; c < 128; ++c) text += char(c);
  text += "\u00A0\u00AD\u00FF\u0100\u07FF\u0800\uFFFD\U00010000\U0010FFFF ok";
  EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text);
}

// One long piece (a run of '=') takes O(n log n) merging: a heap of pairs, not a rescan of the
// piece per merge, which for these 256 KiB would be some 10^10 steps.
TEST(Gpt2Tokenizer, EncodesOneHugePieceQuickly) {
  const std::string text(1 << 18, '=');
  const std::clock_t start = std::clock();
  const std::vector<int32_t> ids = gpt2().encode(text);
  const double seconds = double(std::clock() - start) / CLOCKS_PER_SEC;
  std::cout << "encoded one piece of " << text.size() << " bytes in " << seconds
            << " s of CPU time\n";
  EXPECT_EQ(gpt2().decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 4);
  // Not a benchmark but a bound on the algorithm, with a wide margin over the fraction of a
  // second it takes: the rescans would take minutes.
  EXPECT_LT(seconds, 10.0);
}

TEST(Gpt2Tokenizer, EndOfTextIsSpecialOnlyWhenAllowed) {
  const std::string text = "a<|endoftext|>b<|endoftext|>";
  const std::vector<int32_t> plain = gpt2().encode(text);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(gpt2().decode(plain), text);
  EXPECT_EQ(gpt2().encode(text, Special::allow), (std::vector<int32_t>{64, 50256, 65, 50256}));
  EXPECT_EQ(gpt2().decode(gpt2().encode(text, Special::allow)), text);
}

// Not valid UTF-8: refused with the byte, its offset and its line, however it is broken.
TEST(Gpt2Tokenizer, RefusesTextThatIsNotUtf8) {
  const std::pair<std::string, std::string> cases[] = {
      {"ab\n\x80", "byte 0x80 at byte offset 3 (line 2)"},          // a stray continuation byte
      {"ab\xC0\x80", "byte 0xC0 at byte offset 2 (line 1)"},        // overlong NUL
      {"\xE0\x80\x80", "byte 0xE0 at byte offset 0"},               // overlong 3-byte form
      {"x \xED\xA0\x80", "byte 0xED at byte offset 2"},             // a surrogate, U+D800
      {"\xF4\x90\x80\x80", "byte 0xF4 at byte offset 0"},           // past U+10FFFF
      {"euro \xE2\x82", "byte 0xE2 at byte offset 5"},              // cut off at the end
      {"\xC3(", "byte 0xC3 at byte offset 0"},                      // a bad continuation byte
      {"\xFF", "byte 0xFF at byte offset 0"},
  };
  for (const auto& [text, where] : cases) {
    SCOPED_TRACE(where);
    expect_error([&] { gpt2().encode(text); }, {"not valid UTF-8", where, "bytes tokenizer"});
    expect_error([&] { gpt2().encode(text, Special::allow); }, {where});
  }
  expect_error([&] { gpt2().encode("<|endoftext|>\xFF", Special::allow); }, {"byte offset 13"});
}

// Random text: valid UTF-8 (random code points, many of them spaces, apostrophes and digits)
// must come back exactly; random bytes must come back exactly or be refused with an mt::Error.
TEST(Gpt2Tokenizer, RandomTextRoundTripsAndRandomBytesDoNotCrash) {
  std::mt19937 rng(33);
  auto append_utf8 = [](std::string& s, char32_t cp) {
    if (cp < 0x80) {
      s += char(cp);
    } else if (cp < 0x800) {
      s += {char(0xC0 | cp >> 6), char(0x80 | (cp & 0x3F))};
    } else if (cp < 0x10000) {
      s += {char(0xE0 | cp >> 12), char(0x80 | (cp >> 6 & 0x3F)), char(0x80 | (cp & 0x3F))};
    } else {
      s += {char(0xF0 | cp >> 18), char(0x80 | (cp >> 12 & 0x3F)), char(0x80 | (cp >> 6 & 0x3F)),
            char(0x80 | (cp & 0x3F))};
    }
  };
  const std::string common = " \n\t'sretvmld09aZ.!";
  int refused = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int n = int(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const uint32_t pick = rng() % 4;
      char32_t cp = pick < 2 ? char32_t(common[rng() % common.size()])
                  : pick == 2 ? char32_t(rng() % 0x800)
                              : char32_t(rng() % 0x110000);
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';  // surrogates are not characters
      append_utf8(text, cp);
    }
    ASSERT_EQ(gpt2().decode(gpt2().encode(text)), text) << "trial " << trial;

    std::string bytes(size_t(rng() % 24), '\0');
    for (char& c : bytes) c = char(rng() % 3 ? 'a' + rng() % 3 : rng() % 256);
    try {
      ASSERT_EQ(gpt2().decode(gpt2().encode(bytes)), bytes) << "trial " << trial;
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 100);  // the random bytes did reach the refusal
}

TEST(Gpt2Tokenizer, DecodeRefusesIdsOutsideTheVocabulary) {
  expect_error([] { gpt2().decode(std::vector<int32_t>{15496, 50257}); },
               {"id 50257 at position 1", "0 .. 50256"});
  expect_error([] { gpt2().decode(std::vector<int32_t>{-1}); }, {"id -1 at position 0"});
}

// ---- a vocabulary of our own: the merge order, and each way a vocabulary file can be bad ----

namespace {

// GPT-2's spelling of byte b in its byte alphabet.
std::string byte_char(unsigned b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  unsigned cp = b;
  if (!printable) {
    cp = 0x100;
    for (unsigned k = 0; k < b; ++k)
      if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE)) ++cp;
  }
  if (cp < 0x80) return std::string(1, char(cp));
  return {char(0xC0 | cp >> 6), char(0x80 | (cp & 0x3F))};
}

// The 256 byte tokens, then `extra` tokens, then "<|endoftext|>".
nlohmann::json small_vocab(const std::vector<std::string>& extra) {
  nlohmann::json v = nlohmann::json::object();
  for (unsigned b = 0; b < 256; ++b) v[byte_char(b)] = b;
  for (const std::string& t : extra) v[t] = int(v.size());
  v["<|endoftext|>"] = int(v.size());
  return v;
}

struct SmallFiles {
  TempDir dir;
  std::string encoder, merges;
  SmallFiles(const std::string& encoder_text, const std::string& merges_text)
      : encoder(dir.write("encoder.json", encoder_text)), merges(dir.write("vocab.bpe", merges_text)) {}
  Gpt2Tokenizer load() const { return Gpt2Tokenizer(encoder, merges); }
};

const std::string kGoodMerges = "#version: 0.2\na b\nb c\nab c\na a\naa aa\n";
const std::vector<std::string> kGoodExtra = {"ab", "bc", "abc", "aa", "aaaa"};

}  // namespace

// The lowest-ranked pair merges first wherever it is; a pair's occurrences merge left to right.
TEST(Gpt2Tokenizer, MergesLowestRankFirstAndLeftToRight) {
  const SmallFiles f(small_vocab(kGoodExtra).dump(), kGoodMerges);
  const Gpt2Tokenizer tok = f.load();
  EXPECT_EQ(tok.vocab_size(), 256 + 5 + 1);
  EXPECT_EQ(tok.end_of_text(), 261);
  const int32_t a = 'a', b = 'b', c = 'c', ab = 256, bc = 257, abc = 258, aa = 259, aaaa = 260;
  // "abc": (a b) ranks before (b c), then (ab c) makes abc; "bc" alone takes rank 2.
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{abc}));
  EXPECT_EQ(tok.encode("bc"), (std::vector<int32_t>{bc}));
  EXPECT_EQ(tok.encode("cabcbc"), (std::vector<int32_t>{c, abc, bc}));
  // Runs of 'a': pairs from the left, then pairs of pairs.
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{aa, a}));
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<int32_t>{aaaa}));
  EXPECT_EQ(tok.encode("aaaaa"), (std::vector<int32_t>{aaaa, a}));
  EXPECT_EQ(tok.encode("aab"), (std::vector<int32_t>{a, ab}));  // (a b) ranks before (a a)
  EXPECT_EQ(tok.encode("aaab"), (std::vector<int32_t>{aa, ab}));
  EXPECT_EQ(tok.decode(tok.encode("aaabcc")), "aaabcc");
}

TEST(Gpt2Tokenizer, RefusesAVocabularyThatDoesNotParse) {
  auto load = [](const std::string& encoder, const std::string& merges) {
    return [=] { SmallFiles(encoder, merges).load(); };
  };
  const std::string good = small_vocab(kGoodExtra).dump();
  expect_error(load("{\"a\": 1,", kGoodMerges), {"encoder.json", "not valid JSON"});
  expect_error(load("[1, 2]", kGoodMerges), {"encoder.json", "expected a JSON object"});
  nlohmann::json v = small_vocab(kGoodExtra);
  v["ab"] = "256";
  expect_error(load(v.dump(), kGoodMerges), {"token \"ab\" has id \"256\"", "0 .. 261"});
  v["ab"] = 262;
  expect_error(load(v.dump(), kGoodMerges), {"token \"ab\" has id 262"});
  v["ab"] = 257;
  expect_error(load(v.dump(), kGoodMerges), {"id 257 is given to two tokens"});
  v = small_vocab({"ab", "bc", "abc", "aa", "a a"});
  expect_error(load(v.dump(), kGoodMerges), {"token \"a a\"", "U+20", "outside GPT-2's byte alphabet"});
  v = small_vocab(kGoodExtra);
  v.erase(byte_char(' '));
  v["zz"] = 32;
  expect_error(load(v.dump(), kGoodMerges), {"no token for byte 0x20 (\"Ġ\")"});
  v = small_vocab(kGoodExtra);
  v.erase("<|endoftext|>");
  expect_error(load(v.dump(), kGoodMerges), {"no \"<|endoftext|>\" token"});
  expect_error([] { Gpt2Tokenizer("/nonexistent/encoder.json", "/nonexistent/vocab.bpe"); },
               {"/nonexistent/encoder.json: cannot open GPT-2's vocabulary"});

  // vocab.bpe
  expect_error(load(good, "a b\n"), {"vocab.bpe", "line 1 should be the \"#version: ...\" header"});
  expect_error(load(good, good), {"vocab.bpe", "line 1"});  // encoder.json given for vocab.bpe
  expect_error(load(good, "#version: 0.2\na b\nb  c\n"), {"line 3 (\"b  c\") is not a merge"});
  expect_error(load(good, "#version: 0.2\na b\n\nb c\n"), {"line 3 (\"\") is not a merge"});
  expect_error(load(good, "#version: 0.2\na b\nabc\n"), {"line 3 (\"abc\") is not a merge"});
  expect_error(load(good, "#version: 0.2\na b\nb d\n"), {"line 3: the merged token \"bd\" is not in"});
  expect_error(load(good, "#version: 0.2\na xy\n"), {"line 2: token \"xy\" is not in", "encoder.json"});
  expect_error(load(good, "#version: 0.2\nab c\na b\n"),
               {"line 2: token \"ab\" is used before any merge makes it"});
  expect_error(load(good, "#version: 0.2\na b\na b\n"), {"line 3: \"ab\" is made twice"});
  expect_error([&] { Gpt2Tokenizer(SmallFiles(good, kGoodMerges).encoder, "/nonexistent/vocab.bpe"); },
               {"/nonexistent/vocab.bpe: cannot open GPT-2's merges"});
  // A FIFO for a vocabulary file is refused at once (reading it would wait for a writer).
  TempDir fifo_dir;
  const std::string fifo = fifo_dir / "encoder.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { Gpt2Tokenizer(fifo, "/nonexistent/vocab.bpe"); },
               {"encoder.json: cannot open GPT-2's vocabulary", "FIFO"});
}

// ---- the byte tokenizer, and choosing one by name ----

TEST(ByteTokenizer, RoundTripsEveryByte) {
  const ByteTokenizer tok;
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  const std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[size_t(b)], b);
  EXPECT_EQ(tok.decode(ids), all);
  EXPECT_EQ(tok.encode("<|endoftext|>", Special::allow).size(), 13u);  // no special tokens
  EXPECT_EQ(tok.vocab_size(), 256);
  EXPECT_FALSE(tok.end_of_text().has_value());
  expect_error([&] { tok.decode(std::vector<int32_t>{65, 256}); },
               {"id 256 at position 1", "not a byte"});
}

TEST(Tokenizer, IsChosenByName) {
  const std::unique_ptr<Tokenizer> bytes = make_tokenizer("bytes", kGpt2Dir);
  EXPECT_EQ(bytes->name(), "bytes");
  EXPECT_EQ(bytes->encode("Hi"), (std::vector<int32_t>{72, 105}));
  const std::unique_ptr<Tokenizer> bpe = make_tokenizer("gpt2", kGpt2Dir);
  EXPECT_EQ(bpe->name(), "gpt2");
  EXPECT_EQ(bpe->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  expect_error([] { make_tokenizer("gpt-2", kGpt2Dir); },
               {"unknown tokenizer 'gpt-2'", "bytes and gpt2"});
  expect_error([] { make_tokenizer("gpt2", "/nonexistent"); }, {"/nonexistent/encoder.json"});
}
