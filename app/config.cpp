#include "app/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

namespace mt {
namespace {

// ---- scalars: parsed by hand, so every yaml-cpp version accepts exactly the same spellings ----

template <class T>
bool parse_number(const std::string& s, T& out) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end;
}

bool parse_double(const std::string& s, double& out) {
  return parse_number(s, out) && std::isfinite(out);
}

bool parse_bool(const std::string& s, bool& out) {
  const bool yes = s == "true" || s == "True" || s == "TRUE";
  const bool no = s == "false" || s == "False" || s == "FALSE";
  if (yes || no) out = yes;
  return yes || no;
}

// The offset of the first byte of `s` that is not part of a well-formed UTF-8 sequence (no
// overlong forms, surrogates or code points past U+10FFFF); npos when all of it is.
size_t invalid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = 0;                   // continuation bytes
    unsigned lo = 0x80, hi = 0xbf;  // the range of the first continuation byte
    if (b >= 0xc2 && b <= 0xdf) {
      n = 1;
    } else if (b >= 0xe0 && b <= 0xef) {
      n = 2;
      if (b == 0xe0) lo = 0xa0;  // overlong
      if (b == 0xed) hi = 0x9f;  // a surrogate
    } else if (b >= 0xf0 && b <= 0xf4) {
      n = 3;
      if (b == 0xf0) lo = 0x90;  // overlong
      if (b == 0xf4) hi = 0x8f;  // past U+10FFFF
    } else if (b >= 0x80) {
      return i;
    }
    if (s.size() - i <= n) return i;
    for (size_t j = 1; j <= n; ++j) {
      const auto c = static_cast<unsigned char>(s[i + j]);
      if (c < (j == 1 ? lo : 0x80u) || c > (j == 1 ? hi : 0xbfu)) return i;
    }
    i += n + 1;
  }
  return std::string::npos;
}

// The 1-based line of byte offset `pos` of `text`.
size_t line_of(std::string_view text, size_t pos) {
  return size_t(std::count(text.begin(), text.begin() + long(std::min(pos, text.size())), '\n')) + 1;
}

// Whether the scalar `value`, whose node yaml-cpp placed at `mark` of `text`, spans several source
// lines: a quoted string not closed on the line it opens on, a block scalar (| or >), or a plain
// one folded from several lines (then its text is not all on its first line). Other forms (a tag,
// an alias) count as one line.
bool spans_lines(std::string_view text, const YAML::Mark& mark, const std::string& value) {
  if (mark.is_null() || mark.pos < 0 || size_t(mark.pos) >= text.size()) return false;
  const std::string_view rest = text.substr(size_t(mark.pos));
  const char open = rest[0];
  if (open == '|' || open == '>') return true;
  if (open == '"' || open == '\'') {
    for (size_t i = 1; i < rest.size() && rest[i] != '\n'; ++i) {
      if (open == '"' && rest[i] == '\\') ++i;  // an escaped character, perhaps a quote
      else if (open == '\'' && rest[i] == '\'' && i + 1 < rest.size() && rest[i + 1] == '\'') ++i;
      else if (rest[i] == open) return false;
    }
    return true;
  }
  return !value.empty() && open == value[0] && !rest.starts_with(value);
}

// Shortest text that reads back as exactly `v`.
std::string format_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar:
      return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "an empty value";
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// "; did you mean 'optim.lr'?" when a known key is within two edits of `key`.
std::string suggestion(const std::string& key, const std::vector<std::string>& known,
                       const std::string& prefix) {
  const std::string* best = nullptr;
  size_t best_d = 3;
  for (const std::string& k : known) {
    const size_t d = edit_distance(key, k);
    if (d < best_d) {
      best = &k;
      best_d = d;
    }
  }
  return best ? "; did you mean '" + prefix + *best + "'?" : "";
}

std::string join(std::initializer_list<const char*> items) {
  std::string s;
  for (const char* i : items) s += (s.empty() ? "" : ", ") + std::string(i);
  return s;
}

// Where values come from, for messages: the file (yaml-cpp's 0-based marks, printed 1-based) or,
// for anything at or under an overridden key, the --set that put it there.
struct Origin {
  std::string file;
  std::string_view text;  // the file's YAML, for what yaml-cpp's marks do not tell
  std::vector<std::pair<std::string, std::string>> overrides;  // key path, full "key=value"

  // The --set that gave `key` (or a mapping above it); null when the value is the file's.
  const std::string* override_of(const std::string& key) const {
    for (auto it = overrides.rbegin(); it != overrides.rend(); ++it) {
      const std::string& k = it->first;
      if (key == k || key.starts_with(k + ".") || key.starts_with(k + "[")) return &it->second;
    }
    return nullptr;
  }

  std::string where(const std::string& key, const YAML::Node& node) const {
    if (const std::string* o = override_of(key)) return " (from --set " + *o + ")";
    if (node.IsDefined() && !node.Mark().is_null())
      return " at " + file + ":" + std::to_string(node.Mark().line + 1) + ":" +
             std::to_string(node.Mark().column + 1);
    // A mapping with no place in the file was created to hold an override below it.
    for (auto it = overrides.rbegin(); it != overrides.rend(); ++it)
      if (it->first.starts_with(key + ".")) return " (from --set " + it->second + ")";
    return " (the default)";
  }

  [[noreturn]] void fail(const std::string& key, const YAML::Node& node, const std::string& what,
                         const std::string& hint = "") const {
    throw ConfigError(key + ": " + what + where(key, node) + hint);
  }
};

// One mapping of the config (the top level, `model`, `optim`, ...). Reads the keys the schema
// knows and then, in finish(), rejects whatever else is there: a typo is an error, not a setting
// silently ignored.
class Section {
 public:
  Section(const Origin& origin, const YAML::Node& node, const std::string& path)
      : origin_(origin), path_(path), node_(mapping(origin, node, path)) {}

  std::string key(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }

  // The value at `k` (undefined when absent); every key the schema asks for becomes known.
  YAML::Node at(const std::string& k) {
    known_.push_back(k);
    const YAML::Node& map = node_;  // the const lookup, which does not insert the key
    return map[k];
  }

  Section section(const std::string& k) { return Section(origin_, at(k), key(k)); }

  // Reads `k` into `out` if present; otherwise `out` keeps its default.
  void get(const std::string& k, int64_t& out) {
    scalar(k, out, "an integer", parse_number<int64_t>);
  }
  void get(const std::string& k, uint64_t& out) {
    scalar(k, out, "a non-negative integer", parse_number<uint64_t>);
  }
  void get(const std::string& k, double& out) { scalar(k, out, "a number", parse_double); }
  void get(const std::string& k, bool& out) { scalar(k, out, "true or false", parse_bool); }

  // Every string is a path or a name: it must be valid UTF-8 (a checkpoint stores the config as
  // JSON text) and, in the file, on one line, since a string that runs on is almost always an
  // unclosed quote that swallowed the keys after it.
  void get(const std::string& k, std::string& out) {
    const YAML::Node n = at(k);
    if (!n) return;
    if (!n.IsScalar()) fail(k, "expected a string, got " + describe(n));
    const std::string& v = n.Scalar();
    if (const size_t bad = invalid_utf8(v); bad != std::string::npos) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02x", unsigned(static_cast<unsigned char>(v[bad])));
      fail(k, "is not valid UTF-8: byte " + std::string(byte) + " at offset " +
                  std::to_string(bad) + " of the string");
    }
    if (!origin_.override_of(key(k)) && spans_lines(origin_.text, n.Mark(), v))
      fail(k, "a string must be on one line, but this one runs on past line " +
                  std::to_string(n.Mark().line + 1) + " (an unclosed quote?), got '" +
                  (v.size() > 40 ? v.substr(0, 40) + "..." : v) + "'");
    out = v;
  }

  void get(const std::string& k, std::vector<int64_t>& out) {
    const YAML::Node n = at(k);
    if (!n) return;
    if (!n.IsSequence()) fail(k, "expected a list of integers, got " + describe(n));
    out.clear();
    for (size_t i = 0; i < n.size(); ++i) {
      int64_t v = 0;
      if (!n[i].IsScalar() || !parse_number(n[i].Scalar(), v))
        origin_.fail(item(k, i), n[i], "expected an integer, got " + describe(n[i]));
      out.push_back(v);
    }
  }

  void get(const std::string& k, std::array<double, 2>& out) {
    const YAML::Node n = at(k);
    if (!n) return;
    if (!n.IsSequence() || n.size() != 2)
      fail(k, "expected a list of 2 numbers, got " + describe(n));
    for (size_t i = 0; i < 2; ++i)
      if (!n[i].IsScalar() || !parse_double(n[i].Scalar(), out[i]))
        origin_.fail(item(k, i), n[i], "expected a number, got " + describe(n[i]));
  }

  // A string that must be one of `allowed`.
  void choice(const std::string& k, std::string& out, std::initializer_list<const char*> allowed) {
    get(k, out);
    if (std::find(allowed.begin(), allowed.end(), out) != allowed.end()) return;
    const std::vector<std::string> names(allowed.begin(), allowed.end());
    fail(k, "expected one of " + join(allowed) + ", got '" + out + "'", suggestion(out, names, ""));
  }

  [[noreturn]] void fail(const std::string& k, const std::string& what,
                         const std::string& hint = "") {
    origin_.fail(key(k), place(k), what, hint);
  }

  // Throws "<key>: <what>, got <value><where>" unless `ok`.
  template <class T>
  void require(const std::string& k, const T& value, bool ok, const std::string& what) {
    if (!ok) fail(k, what + ", got " + text(value));
  }
  template <class T>
  void require_item(const std::string& k, size_t i, const T& value, bool ok,
                    const std::string& what) {
    if (ok) return;
    const YAML::Node seq = at(k);
    origin_.fail(item(k, i), seq ? seq[i] : seq, what + ", got " + text(value));
  }

  // Unknown and repeated keys.
  void finish() const {
    std::set<std::string> seen;
    for (const auto& pair : node_) {  // not `it->first`: yaml-cpp's iterator hands out temporaries
      const YAML::Node& k = pair.first;
      if (!k.IsScalar())
        origin_.fail(path_.empty() ? "top level" : path_, k,
                     "keys must be plain names, got " + describe(k));
      const std::string name = k.Scalar();
      if (std::find(known_.begin(), known_.end(), name) == known_.end())
        origin_.fail(key(name), k, "unknown key",
                     suggestion(name, known_, path_.empty() ? "" : path_ + "."));
      if (!seen.insert(name).second) origin_.fail(key(name), k, "duplicate key");
    }
  }

 private:
  template <class T, class Parse>
  void scalar(const std::string& k, T& out, const char* expected, Parse parse) {
    const YAML::Node n = at(k);
    if (!n) return;
    if (!n.IsScalar() || !parse(n.Scalar(), out))
      fail(k, std::string("expected ") + expected + ", got " + describe(n));
  }

  // An absent or empty section (`model:`) means all defaults.
  static YAML::Node mapping(const Origin& origin, const YAML::Node& node, const std::string& path) {
    if (!node.IsDefined() || node.IsNull()) return YAML::Node(YAML::NodeType::Map);
    if (!node.IsMap()) origin.fail(path, node, "expected a mapping of keys, got " + describe(node));
    return node;
  }

  // The node an error about `k` points at: its value, or the key itself when the value is empty
  // (yaml-cpp places an empty value at the next token, often on the next line). A default-made
  // node, which has no position, when `k` is absent.
  YAML::Node place(const std::string& k) const {
    for (const auto& pair : node_)
      if (pair.first.IsScalar() && pair.first.Scalar() == k)
        return pair.second.IsNull() ? pair.first : pair.second;
    return YAML::Node();
  }

  std::string item(const std::string& k, size_t i) const {
    return key(k) + "[" + std::to_string(i) + "]";
  }

  static std::string text(double v) { return format_double(v); }
  static std::string text(int64_t v) { return std::to_string(v); }
  static std::string text(const std::string& v) { return "'" + v + "'"; }

  const Origin& origin_;
  std::string path_;
  YAML::Node node_;
  std::vector<std::string> known_;
};

bool exists(const std::string& path) {
  std::error_code ec;  // an unreadable parent directory counts as "not there", not an exception
  return std::filesystem::exists(path, ec);
}

bool regular_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

const std::string kMaxWidthText = "must be at most " + std::to_string(kMaxWidth);
const std::string kMaxSamplesText = "must be at most " + std::to_string(kMaxSamples);

void read_model(Section s, ModelConfig& m) {
  s.choice("kind", m.kind, {"mlp", "gpt"});
  s.get("input", m.input);
  s.require("input", m.input, m.input >= 1, "must be at least 1");
  s.require("input", m.input, m.input <= kMaxWidth, kMaxWidthText);
  s.get("hidden", m.hidden);
  if (m.hidden.size() > kMaxLayers)
    s.fail("hidden", "at most " + std::to_string(kMaxLayers) + " hidden layers, got " +
                         std::to_string(m.hidden.size()));
  for (size_t i = 0; i < m.hidden.size(); ++i) {
    s.require_item("hidden", i, m.hidden[i], m.hidden[i] >= 1, "layer widths must be at least 1");
    s.require_item("hidden", i, m.hidden[i], m.hidden[i] <= kMaxWidth,
                   "layer widths " + kMaxWidthText);
  }
  s.get("classes", m.classes);
  s.require("classes", m.classes, m.classes >= 2, "must be at least 2");
  s.require("classes", m.classes, m.classes <= kMaxWidth, kMaxWidthText);
  s.choice("norm", m.norm, {"rms_norm", "none"});
  s.choice("activation", m.activation, {"scaled_silu", "relu"});
  s.get("bias", m.bias);
  for (auto [key, v] : {std::pair{"n_layer", &m.n_layer}, {"n_head", &m.n_head},
                        {"n_embd", &m.n_embd}, {"block_size", &m.block_size},
                        {"vocab_size", &m.vocab_size}}) {
    s.get(key, *v);
    s.require(key, *v, *v >= 1, "must be at least 1");
    s.require(key, *v, *v <= kMaxWidth, kMaxWidthText);
  }
  s.require("n_embd", m.n_embd, m.n_embd % m.n_head == 0,
            "must be divisible by model.n_head = " + std::to_string(m.n_head));
  s.get("padded_vocab_size", m.padded_vocab_size);
  s.require("padded_vocab_size", m.padded_vocab_size,
            m.padded_vocab_size == 0 || (m.padded_vocab_size >= m.vocab_size &&
                                         m.padded_vocab_size <= kMaxWidth),
            "must be 0 (vocab_size rounded up to a multiple of 64) or in [model.vocab_size = " +
                std::to_string(m.vocab_size) + ", " + std::to_string(kMaxWidth) + "]");
  s.get("dropout", m.dropout);
  s.require("dropout", m.dropout, m.dropout >= 0 && m.dropout < 1, "must be in [0, 1)");
  s.finish();
}

void read_data(Section& s, DataConfig& d) {
  s.choice("kind", d.kind, {"synthetic", "mnist", "csv", "text", "tokens"});
  s.get("samples", d.samples);
  s.require("samples", d.samples, d.samples >= 1, "must be at least 1");
  s.require("samples", d.samples, d.samples <= kMaxSamples, kMaxSamplesText);
  s.get("noise", d.noise);
  s.require("noise", d.noise, d.noise >= 0, "must be >= 0");
  s.get("path", d.path);
  s.get("test_path", d.test_path);
  s.get("label_column", d.label_column);
  s.require("label_column", d.label_column, d.label_column >= -1,
            "must be -1 (the last column) or a column index from 0");
  s.require("label_column", d.label_column, d.label_column <= kMaxWidth, kMaxWidthText);
  s.choice("header", d.header, {"auto", "true", "false"});
  s.get("standardize", d.standardize);
  s.get("val_fraction", d.val_fraction);
  s.require("val_fraction", d.val_fraction, d.val_fraction >= 0 && d.val_fraction < 1,
            "must be in [0, 1)");
  s.get("shuffle", d.shuffle);
  s.get("seed", d.seed);
  s.choice("tokenizer", d.tokenizer, {"bytes", "gpt2"});
  s.get("gpt2_dir", d.gpt2_dir);
  s.get("block_size", d.block_size);
  s.require("block_size", d.block_size, d.block_size >= 0 && d.block_size <= kMaxWidth,
            "must be 0 (model.block_size) or in [1, " + std::to_string(kMaxWidth) + "]");
  s.get("eval_windows", d.eval_windows);
  s.require("eval_windows", d.eval_windows, d.eval_windows >= 0 && d.eval_windows <= kMaxSamples,
            "must be 0 (every held-out window) or in [1, " + std::to_string(kMaxSamples) + "]");
  s.finish();

  // Missing data is found now, not after the model is built.
  if (d.kind == "synthetic") return;
  s.require("path", d.path, !d.path.empty(), "is required for data.kind " + d.kind);
  s.require("path", d.path, exists(d.path),
            "no such file or directory (needed for data.kind " + d.kind + ")");
  s.require("test_path", d.test_path, d.test_path.empty() || exists(d.test_path),
            "no such file or directory");
  // A CSV or a text is read to its end: a device or pipe (/dev/zero) has no size that bounds that.
  if (d.kind != "csv" && d.kind != "text") return;
  const std::string not_regular = "is not a regular file (a device or pipe may never end)";
  s.require("path", d.path, regular_file(d.path), not_regular);
  s.require("test_path", d.test_path, d.test_path.empty() || regular_file(d.test_path),
            not_regular);
}

// The generated data's sizes follow from the config alone, so too few samples is a config error
// now, not a failure after start-up (file data is checked by the trainer once it is loaded).
void check_synthetic_sizes(Section& s, const DataConfig& d, const OptimConfig& o) {
  if (d.kind != "synthetic") return;
  s.require("samples", d.samples, synthetic_test_samples(d.samples) >= 1,
            "must be at least 5 for synthetic data, which draws a fifth as many for the test set");
  const int64_t val = data::validation_samples(d.samples, d.val_fraction);
  s.require("val_fraction", d.val_fraction, d.val_fraction == 0 || val >= 1,
            "must hold out at least one of data.samples = " + std::to_string(d.samples) +
                " (or be 0 for no validation)");
  s.require("samples", d.samples, d.samples - val >= o.batch_size,
            "must leave optim.batch_size = " + std::to_string(o.batch_size) +
                " samples for training after data.val_fraction holds out " + std::to_string(val));
}

void read_optim(Section s, OptimConfig& o) {
  s.choice("name", o.name, {"adamw", "sgd"});
  s.get("lr", o.lr);
  s.require("lr", o.lr, o.lr > 0, "must be > 0");
  s.get("weight_decay", o.weight_decay);
  s.require("weight_decay", o.weight_decay, o.weight_decay >= 0, "must be >= 0");
  s.get("betas", o.betas);
  for (size_t i = 0; i < 2; ++i)
    s.require_item("betas", i, o.betas[i], o.betas[i] >= 0 && o.betas[i] < 1, "must be in [0, 1)");
  s.get("eps", o.eps);
  s.require("eps", o.eps, o.eps > 0, "must be > 0");
  s.get("momentum", o.momentum);
  s.require("momentum", o.momentum, o.momentum >= 0 && o.momentum < 1, "must be in [0, 1)");
  s.get("nesterov", o.nesterov);
  s.get("shard_state", o.shard_state);
  s.choice("schedule", o.schedule, {"constant", "cosine"});
  s.get("warmup_steps", o.warmup_steps);
  s.require("warmup_steps", o.warmup_steps, o.warmup_steps >= 0, "must be >= 0");
  s.get("min_lr", o.min_lr);
  s.require("min_lr", o.min_lr, o.min_lr >= 0, "must be >= 0");
  s.get("steps", o.steps);
  s.require("steps", o.steps, o.steps >= 1, "must be at least 1");
  s.get("epochs", o.epochs);
  s.require("epochs", o.epochs, o.epochs >= 0, "must be >= 0 (0: optim.steps sets the length)");
  s.require("epochs", o.epochs, o.epochs <= kMaxSamples, kMaxSamplesText);
  s.get("batch_size", o.batch_size);
  s.require("batch_size", o.batch_size, o.batch_size >= 1, "must be at least 1");
  s.require("batch_size", o.batch_size, o.batch_size <= kMaxSamples, kMaxSamplesText);
  s.get("microbatches", o.microbatches);
  s.require("microbatches", o.microbatches, o.microbatches >= 1, "must be at least 1");
  s.get("clip_norm", o.clip_norm);
  s.require("clip_norm", o.clip_norm, o.clip_norm >= 0, "must be >= 0 (0 turns clipping off)");
  s.finish();

  // Checks between keys come after finish(), so a misspelled key is reported as that rather than
  // as a conflict with the default it failed to replace.
  s.require("microbatches", o.microbatches, o.microbatches <= o.batch_size,
            "must not exceed optim.batch_size = " + std::to_string(o.batch_size));
  s.require("min_lr", o.min_lr, o.min_lr <= o.lr,
            "must not exceed optim.lr = " + format_double(o.lr));
  if (o.name == "sgd" && o.nesterov && o.momentum == 0)
    s.fail("nesterov", "needs optim.momentum > 0");
  if (o.shard_state && o.name != "adamw") s.fail("shard_state", "shards AdamW's state: needs optim.name adamw");
}

void read_precision(Section s, PrecisionConfig& p, const std::string& device) {
  std::string dtype = dtype_name(p.compute_dtype);
  s.choice("compute_dtype", dtype, {"f64", "f32", "bf16", "f16"});
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::f16})
    if (dtype == dtype_name(t)) p.compute_dtype = t;
  s.get("deterministic", p.deterministic);
  s.get("gemm_autotune", p.gemm_autotune);

  const YAML::Node ls = s.at("loss_scale");
  if (ls) {
    double v = 0;
    if (ls.IsScalar() && (ls.Scalar() == "dynamic" || ls.Scalar() == "none")) {
      p.loss_scale = ls.Scalar();
      p.fixed_loss_scale = 0;
    } else if (ls.IsScalar() && parse_double(ls.Scalar(), v) && v > 0) {
      p.loss_scale = "fixed";
      p.fixed_loss_scale = v;
    } else {
      s.fail("loss_scale", "expected dynamic, none or a positive number, got " + describe(ls));
    }
  }
  s.get("initial_scale", p.initial_scale);
  s.require("initial_scale", p.initial_scale, p.initial_scale >= 1, "must be at least 1");
  s.get("growth_interval", p.growth_interval);
  s.require("growth_interval", p.growth_interval, p.growth_interval >= 1, "must be at least 1");
  s.finish();

  if (p.compute_dtype == DType::f64 && device.starts_with("cuda"))
    s.fail("compute_dtype", "f64 runs on the CPU only, but device is " + device);
}

void read_eval(Section s, EvalConfig& e) {
  s.get("every", e.every);
  s.require("every", e.every, e.every >= 1, "must be at least 1");
  s.get("batch_size", e.batch_size);
  s.require("batch_size", e.batch_size, e.batch_size >= 1, "must be at least 1");
  s.require("batch_size", e.batch_size, e.batch_size <= kMaxSamples, kMaxSamplesText);
  s.finish();
}

void read_checkpoint(Section s, CheckpointConfig& c) {
  s.get("dir", c.dir);
  s.require("dir", c.dir, !c.dir.empty(), "must not be empty");
  s.get("every", c.every);
  s.require("every", c.every, c.every >= 1, "must be at least 1");
  s.get("keep_last", c.keep_last);
  s.require("keep_last", c.keep_last, c.keep_last >= 1, "must be at least 1");
  s.get("overwrite", c.overwrite);
  s.finish();
}

void read_logging(Section s, LoggingConfig& l) {
  s.get("every", l.every);
  s.require("every", l.every, l.every >= 1, "must be at least 1");
  s.get("metrics", l.metrics);
  s.get("curve", l.curve);
  s.finish();
}

Config read_config(const Origin& origin, const YAML::Node& root) {
  Config c;
  Section top(origin, root, "");
  top.get("seed", c.seed);
  top.get("device", c.device);
  top.require("device", c.device, valid_device(c.device), "expected auto, cpu, cuda or cuda:N");
  read_model(top.section("model"), c.model);
  Section data = top.section("data");
  read_data(data, c.data);
  read_optim(top.section("optim"), c.optim);
  check_synthetic_sizes(data, c.data, c.optim);
  // A GPT trains on token data and token data trains a GPT; its windows fit the model.
  const bool tokens = c.data.kind == "text" || c.data.kind == "tokens";
  data.require("kind", c.data.kind, tokens == (c.model.kind == "gpt"),
               tokens ? "trains a model.kind gpt, but model.kind is " + c.model.kind
                      : "is not token data; model.kind gpt trains on data.kind text or tokens");
  data.require("block_size", c.data.block_size, c.data.block_size <= c.model.block_size,
               "is larger than the model's block_size " + std::to_string(c.model.block_size) +
                   " (its position table has that many rows)");
  read_precision(top.section("precision"), c.precision, c.device);
  read_eval(top.section("eval"), c.eval);
  read_checkpoint(top.section("checkpoint"), c.checkpoint);
  read_logging(top.section("logging"), c.logging);
  top.get("cuda_graph", c.cuda_graph);
  top.finish();
  return c;
}

// Merges the mapping `from` into the mapping `into`, key by key: a mapping into a mapping merges
// further down, anything else (a scalar, a list) replaces. `leaves` collects the key path of
// every value set, so that messages name the --set that gave each one.
void merge(YAML::Node into, const YAML::Node& from, const std::string& path,
           std::vector<std::string>& leaves, const std::string& text) {
  for (const auto& pair : from) {
    if (!pair.first.IsScalar())
      throw ConfigError("--set " + text + ": keys must be plain names, got " +
                        describe(pair.first));
    const std::string k = pair.first.Scalar(), key = path + "." + k;
    YAML::Node child = into[k];
    if (pair.second.IsMap() && child.IsMap()) {
      merge(child, pair.second, key, leaves, text);
    } else {
      into[k] = pair.second;
      leaves.push_back(key);
    }
  }
}

// Sets root[k1][k2]...= value, creating the mappings on the way. A mapping set where a mapping is
// merges into it (`--set 'optim={lr: 0.01}'` changes optim.lr and keeps the rest of optim).
void set_path(YAML::Node node, const std::vector<std::string>& keys, size_t i,
              const YAML::Node& value, const Origin& origin, const std::string& text,
              std::vector<std::string>& leaves) {
  std::string path;
  for (size_t j = 0; j <= i; ++j) path += (j ? "." : "") + keys[j];
  if (i + 1 == keys.size()) {
    YAML::Node target = node[keys[i]];
    if (value.IsMap() && target.IsMap()) {
      merge(target, value, path, leaves, text);
    } else {
      node[keys[i]] = value;
      leaves.push_back(path);
    }
    return;
  }
  YAML::Node child = node[keys[i]];
  if (child.IsDefined() && !child.IsNull() && !child.IsMap())
    origin.fail(path, child, "expected a mapping, got " + describe(child),
                " (while applying --set " + text + ")");
  if (!child.IsMap()) child = YAML::Node(YAML::NodeType::Map);
  set_path(child, keys, i + 1, value, origin, text, leaves);
}

void apply_override(YAML::Node& root, const std::string& text, Origin& origin) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos)
    throw ConfigError("--set " + text + ": expected key.path=value, e.g. optim.lr=1e-3");
  const std::string key = text.substr(0, eq);
  std::vector<std::string> keys;
  std::stringstream parts(key);
  for (std::string part; std::getline(parts, part, '.');) keys.push_back(part);
  if (keys.empty() || key.back() == '.' ||
      std::any_of(keys.begin(), keys.end(), [](const std::string& k) { return k.empty(); }))
    throw ConfigError("--set " + text + ": '" + key + "' is not a key path like optim.lr");
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError("--set " + text + ": the value is not valid YAML: " + e.msg);
  }
  std::vector<std::string> leaves;
  set_path(root, keys, 0, value, origin, text, leaves);
  for (const std::string& leaf : leaves) origin.overrides.emplace_back(leaf, text);
}

// Where each document of a stream starts; builds nothing.
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// The 1-based line of the `---` (or `...`) that begins the document yaml-cpp placed at `mark`:
// the nearest such line at or above it (yaml-cpp marks the document's first node).
size_t marker_line(std::string_view text, const YAML::Mark& mark) {
  size_t end = std::min(size_t(std::max(mark.pos, 0)), text.size());
  while (true) {
    const size_t begin = end == 0 ? 0 : text.rfind('\n', end - 1) + 1;  // npos + 1 == 0
    const std::string_view line = text.substr(begin);
    if (line.starts_with("---") || line.starts_with("...")) return line_of(text, begin);
    if (begin == 0) return size_t(mark.line) + 1;
    end = begin - 1;
  }
}

// YAML double-quoted string; control bytes as \xHH escapes.
std::string quote(const std::string& s) {
  std::string q = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      q += '\\';
      q += char(ch);
    } else if (ch < 0x20 || ch == 0x7f) {
      const char* hex = "0123456789abcdef";
      q += "\\x";
      q += hex[ch >> 4];
      q += hex[ch & 15];
    } else {
      q += char(ch);
    }
  }
  return q + "\"";
}

}  // namespace

bool valid_device(const std::string& d) {
  if (d == "auto" || d == "cpu" || d == "cuda") return true;
  if (!d.starts_with("cuda:") || d.size() == 5 || d.size() > 8) return false;
  return std::all_of(d.begin() + 5, d.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Config parse_config(const std::string& yaml, const std::string& name,
                    const std::vector<std::string>& overrides) {
  Origin origin{name, yaml, {}};
  YAML::Node root;
  try {
    // YAML::Load() would quietly drop every document after the first. (Not LoadAll(): where
    // yaml-cpp 0.7 meets a token it cannot parse, such as a leading ',', it starts a new empty
    // document at that same token, without end; jbeder/yaml-cpp#1040.)
    std::istringstream in(yaml);
    YAML::Parser parser(in);
    DocumentStarts docs;
    for (int i = 0; i < 2 && parser.HandleNextDocument(docs); ++i) {
    }
    if (docs.starts.size() > 1 && docs.starts[1].pos == docs.starts[0].pos)
      throw YAML::ParserException(docs.starts[1], "unexpected '" +
                                                      std::string(1, yaml[size_t(docs.starts[1].pos)]) + "'");
    if (docs.starts.size() > 1)
      throw ConfigError(name + ":" + std::to_string(marker_line(yaml, docs.starts[1])) +
                        ": a second YAML document starts here; a config is one document");
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(name + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": YAML syntax error: " + e.msg);
  }
  if (root.IsDefined() && !root.IsNull() && !root.IsMap())
    throw ConfigError(name + ": the config must be a mapping of keys, got " + describe(root));
  if (!root.IsMap()) root = YAML::Node(YAML::NodeType::Map);
  for (const std::string& o : overrides) apply_override(root, o, origin);
  return read_config(origin, root);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return parse_config("", "<defaults>", overrides);
  if (!exists(path)) throw ConfigError("config file " + path + " does not exist");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError("config file " + path + " is a directory");
  const std::string limit = std::to_string(kMaxConfigBytes) + " bytes (16 MiB)";
  const bool regular = regular_file(path);
  if (regular) {
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec && size > kMaxConfigBytes)
      throw ConfigError("config file " + path + " is " + std::to_string(size) +
                        " bytes; a config may have at most " + limit);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read config file " + path + ": " + std::strerror(errno));
  // Never more than one byte past the limit: a device or pipe (/dev/zero) may not end at all.
  std::string text;
  char chunk[1 << 16];
  while (text.size() <= kMaxConfigBytes && in.read(chunk, sizeof chunk).gcount() > 0)
    text.append(chunk, size_t(in.gcount()));
  if (in.bad()) throw ConfigError("cannot read config file " + path + ": " + std::strerror(errno));
  if (text.size() > kMaxConfigBytes)
    throw ConfigError("config file " + path + " gives more than " + limit +
                      ", the most a config may have" + (regular ? "" : " (it is not a regular file)"));
  return parse_config(text, path, overrides);
}

std::string to_yaml(const Config& c) {
  auto ints = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  auto num = format_double;
  auto flag = [](bool b) { return b ? "true" : "false"; };
  const std::string loss_scale = c.precision.loss_scale == "fixed"
                                     ? num(c.precision.fixed_loss_scale)
                                     : c.precision.loss_scale;

  std::ostringstream y;
  y << "seed: " << c.seed << "\n"
    << "device: " << quote(c.device) << "\n"
    << "model:\n"
    << "  kind: " << quote(c.model.kind) << "\n"
    << "  input: " << c.model.input << "\n"
    << "  hidden: " << ints(c.model.hidden) << "\n"
    << "  classes: " << c.model.classes << "\n"
    << "  norm: " << quote(c.model.norm) << "\n"
    << "  activation: " << quote(c.model.activation) << "\n"
    << "  bias: " << flag(c.model.bias) << "\n"
    << "  n_layer: " << c.model.n_layer << "\n"
    << "  n_head: " << c.model.n_head << "\n"
    << "  n_embd: " << c.model.n_embd << "\n"
    << "  block_size: " << c.model.block_size << "\n"
    << "  vocab_size: " << c.model.vocab_size << "\n"
    << "  padded_vocab_size: " << c.model.padded_vocab_size << "\n"
    << "  dropout: " << num(c.model.dropout) << "\n"
    << "data:\n"
    << "  kind: " << quote(c.data.kind) << "\n"
    << "  samples: " << c.data.samples << "\n"
    << "  noise: " << num(c.data.noise) << "\n"
    << "  path: " << quote(c.data.path) << "\n"
    << "  test_path: " << quote(c.data.test_path) << "\n"
    << "  label_column: " << c.data.label_column << "\n"
    << "  header: " << c.data.header << "\n"
    << "  standardize: " << flag(c.data.standardize) << "\n"
    << "  val_fraction: " << num(c.data.val_fraction) << "\n"
    << "  shuffle: " << flag(c.data.shuffle) << "\n"
    << "  seed: " << c.data.seed << "\n"
    << "  tokenizer: " << quote(c.data.tokenizer) << "\n"
    << "  gpt2_dir: " << quote(c.data.gpt2_dir) << "\n"
    << "  block_size: " << c.data.block_size << "\n"
    << "  eval_windows: " << c.data.eval_windows << "\n"
    << "optim:\n"
    << "  name: " << quote(c.optim.name) << "\n"
    << "  lr: " << num(c.optim.lr) << "\n"
    << "  weight_decay: " << num(c.optim.weight_decay) << "\n"
    << "  betas: [" << num(c.optim.betas[0]) << ", " << num(c.optim.betas[1]) << "]\n"
    << "  eps: " << num(c.optim.eps) << "\n"
    << "  momentum: " << num(c.optim.momentum) << "\n"
    << "  nesterov: " << flag(c.optim.nesterov) << "\n"
    << "  shard_state: " << flag(c.optim.shard_state) << "\n"
    << "  schedule: " << quote(c.optim.schedule) << "\n"
    << "  warmup_steps: " << c.optim.warmup_steps << "\n"
    << "  min_lr: " << num(c.optim.min_lr) << "\n"
    << "  steps: " << c.optim.steps << "\n"
    << "  epochs: " << c.optim.epochs << "\n"
    << "  batch_size: " << c.optim.batch_size << "\n"
    << "  microbatches: " << c.optim.microbatches << "\n"
    << "  clip_norm: " << num(c.optim.clip_norm) << "\n"
    << "precision:\n"
    << "  compute_dtype: " << dtype_name(c.precision.compute_dtype) << "\n"
    << "  deterministic: " << flag(c.precision.deterministic) << "\n"
    << "  gemm_autotune: " << flag(c.precision.gemm_autotune) << "\n"
    << "  loss_scale: " << loss_scale << "\n"
    << "  initial_scale: " << num(c.precision.initial_scale) << "\n"
    << "  growth_interval: " << c.precision.growth_interval << "\n"
    << "eval:\n"
    << "  every: " << c.eval.every << "\n"
    << "  batch_size: " << c.eval.batch_size << "\n"
    << "checkpoint:\n"
    << "  dir: " << quote(c.checkpoint.dir) << "\n"
    << "  every: " << c.checkpoint.every << "\n"
    << "  keep_last: " << c.checkpoint.keep_last << "\n"
    << "  overwrite: " << flag(c.checkpoint.overwrite) << "\n"
    << "logging:\n"
    << "  every: " << c.logging.every << "\n"
    << "  metrics: " << quote(c.logging.metrics) << "\n"
    << "  curve: " << quote(c.logging.curve) << "\n"
    << "cuda_graph: " << flag(c.cuda_graph) << "\n";
  return y.str();
}

std::string metrics_path(const Config& c) {
  if (!c.logging.metrics.empty()) return c.logging.metrics;
  return (std::filesystem::path(c.checkpoint.dir) / "metrics.jsonl").string();
}

std::string curve_path(const Config& c) {
  if (!c.logging.curve.empty()) return c.logging.curve;
  return (std::filesystem::path(c.checkpoint.dir) / "curve.svg").string();
}

}  // namespace mt
