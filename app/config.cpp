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
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "app/registry.h"
#include "core/input_file.h"

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

// "; did you mean 'optim.lr'?" when a known key is within two edits of `key`, or is the name
// PyTorch, Hugging Face or Keras users reach for (learning_rate, optimizer, ...).
std::string suggestion(const std::string& key, const std::vector<std::string>& known,
                       const std::string& prefix) {
  static const std::pair<const char*, const char*> kOtherNames[] = {
      {"learning_rate", "lr"}, {"optimizer", "optim"},   {"weight_decay_rate", "weight_decay"},
      {"max_steps", "steps"},  {"num_steps", "steps"},   {"warmup", "warmup_steps"},
      {"grad_clip", "clip_norm"}, {"max_grad_norm", "clip_norm"}, {"gradient_accumulation_steps", "microbatches"}};
  for (const auto& [other, ours] : kOtherNames)
    if (key == other && std::find(known.begin(), known.end(), ours) != known.end())
      return "; did you mean '" + prefix + ours + "'?";
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
    // A path is handed to the system as a C string: "ck\0pt" would name the folder ck.
    if (const size_t nul = v.find('\0'); nul != std::string::npos)
      fail(k, "holds a NUL byte at offset " + std::to_string(nul) + " of the string");
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

  // The rules of `k` (train/rules.h: a value train::Options also has) on the config read so far,
  // each with the message train::validate gives and where the value came from; `k`'s value was
  // just read. A list's rules are its items' ("optim.betas[1]").
  void check(const std::string& k, const Config& c) {
    std::optional<train::Options> o;  // made only for a key that has rules
    for (const train::Rule& r : train::rules()) {
      if (r.between_keys || (r.key != key(k) && !r.key.starts_with(key(k) + "["))) continue;
      if (!o) o = app::options_from(c);
      if (const std::string what = r.check(*o); !what.empty()) fail_rule(k, r, what);
    }
  }

  // The rules between this section's keys, once all of them are read.
  void check_between(const Config& c) {
    const train::Options o = app::options_from(c);
    for (const train::Rule& r : train::rules())
      if (r.between_keys && r.key.starts_with(path_ + "."))
        if (const std::string what = r.check(o); !what.empty())
          fail_rule(r.key.substr(path_.size() + 1), r, what);
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

  // Throws the message of the rule `r` of `k`: at the value, or at the item a list's rule names.
  [[noreturn]] void fail_rule(const std::string& k, const train::Rule& r, const std::string& what) {
    const std::string hint = r.choices.empty() || !place(k).IsScalar()
                                 ? "" : suggestion(place(k).Scalar(), r.choices, "");
    if (r.key == key(k)) fail(k, what, hint);
    const YAML::Node seq = at(k);
    const size_t i = std::stoul(r.key.substr(key(k).size() + 1));
    origin_.fail(r.key, seq ? seq[i] : seq, what, hint);
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

size_t second_document_line(const std::string& yaml);

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
    const std::string v = text.substr(eq + 1);
    if (const size_t second = second_document_line(v))
      throw ConfigError("--set " + text + ": the value holds a second YAML document (line " +
                        std::to_string(second) + "); a value is one document");
    value = YAML::Load(v);
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

// 0 when `yaml` is at most one document; else the 1-based line where the second one starts.
// Documents are counted by an event pass that stops at the second: YAML::Load() would quietly
// drop every document after the first. (Not LoadAll(): where yaml-cpp 0.7 meets a token it
// cannot parse, such as a leading ',', it starts a new empty document at that same token,
// without end; jbeder/yaml-cpp#1040.) Throws YAML::ParserException for a syntax error.
size_t second_document_line(const std::string& yaml) {
  std::istringstream in(yaml);
  YAML::Parser parser(in);
  DocumentStarts docs;
  for (int i = 0; i < 2 && parser.HandleNextDocument(docs); ++i) {
  }
  if (docs.starts.size() > 1 && docs.starts[1].pos == docs.starts[0].pos)
    throw YAML::ParserException(docs.starts[1], "unexpected '" +
                                                    std::string(1, yaml[size_t(docs.starts[1].pos)]) + "'");
  return docs.starts.size() > 1 ? marker_line(yaml, docs.starts[1]) : 0;
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

// ---- the schema: every key of the config, once ------------------------------------------------
// Each row says where a key is, what the reference (docs/config.md) says of it, how it is read
// (with the checks of its value alone) and how it is written back: parse_config, to_yaml (so
// --print-config) and reference_table() all go through these rows, so a key cannot be parsed but
// not printed or documented. A value train::Options also has is checked by train::validate's
// rules (train/rules.h), which read_rows applies after the row, not by the row. Checks between
// keys follow each section (read_config); the keys a model or data kind adds are the kind's own
// (app/registry.h), read after the section's rows.

const std::string kMaxWidthText = "must be at most " + std::to_string(kMaxWidth);
const std::string kMaxSamplesText = "must be at most " + std::to_string(kMaxSamples);

std::string flag(bool b) { return b ? "true" : "false"; }

std::string ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// A registered kind; the message lists the documented ones (a test's own kinds are accepted but
// not offered), the suggestion may name any.
template <class Kind>
void read_kind(Section& s, std::string& kind, const std::vector<const Kind*>& kinds) {
  s.get("kind", kind);
  std::vector<std::string> names;
  std::string list;
  for (const Kind* k : kinds) {
    if (k->name == kind) return;
    names.push_back(k->name);
    if (k->documented) list += (list.empty() ? "" : ", ") + k->name;
  }
  s.fail("kind", "expected one of " + list + ", got '" + kind + "'", suggestion(kind, names, ""));
}

void read_model_kind(Section& s, Config& c) { read_kind(s, c.model.kind, app::model_kinds()); }
void read_data_kind(Section& s, Config& c) { read_kind(s, c.data.kind, app::data_kinds()); }

void read_model_hidden(Section& s, Config& c) {
  std::vector<int64_t>& hidden = c.model.hidden;
  s.get("hidden", hidden);
  if (hidden.size() > kMaxLayers)
    s.fail("hidden", "at most " + std::to_string(kMaxLayers) + " hidden layers, got " +
                         std::to_string(hidden.size()));
  for (size_t i = 0; i < hidden.size(); ++i) {
    s.require_item("hidden", i, hidden[i], hidden[i] >= 1, "layer widths must be at least 1");
    s.require_item("hidden", i, hidden[i], hidden[i] <= kMaxWidth, "layer widths " + kMaxWidthText);
  }
}

// Above 2^40 every f16 gradient but zero overflows once scaled (65504 / 2^40 is below f16's
// smallest subnormal, 6e-8): a fixed scale skips every step, and a dynamic one halves through
// skipped steps until it is back in range (from 1e300, some 980 of them).
constexpr double kMaxLossScale = 1099511627776.0;
const std::string kMaxLossScaleWhy = "beyond it every non-zero f16 gradient overflows and every step is skipped";

void read_loss_scale(Section& s, PrecisionConfig& p) {
  const YAML::Node ls = s.at("loss_scale");
  if (!ls) return;
  double v = 0;
  if (ls.IsScalar() && (ls.Scalar() == "dynamic" || ls.Scalar() == "none")) {
    p.loss_scale = ls.Scalar();
    p.fixed_loss_scale = 0;
  } else if (ls.IsScalar() && parse_double(ls.Scalar(), v) && v > 0) {
    if (v > kMaxLossScale)
      s.fail("loss_scale", "must be at most 2^40 (" + kMaxLossScaleWhy + "), got " + ls.Scalar());
    p.loss_scale = "fixed";
    p.fixed_loss_scale = v;
  } else {
    s.fail("loss_scale", "expected dynamic, none or a positive number, got " + describe(ls));
  }
}

struct Row {
  const char* section;  // "" for the top level
  const char* key;
  const char* type;  // the reference's columns
  const char* meaning;
  const char* constraints;
  void (*read)(Section& s, Config& c);  // `s` is the row's section
  std::string (*write)(const Config& c);  // the value as YAML
};

const std::vector<Row>& rows() {
  static const std::vector<Row> all = {
    {"", "seed", "int",
     "seed for parameter initialization",
     "≥ 0",
     [](Section& s, Config& c) {
      s.get("seed", c.seed);
     },
     [](const Config& c) -> std::string { return std::to_string(c.seed); }},
    {"", "device", "string",
     "where to train; `auto` picks the first GPU if there is one",
     "`auto`, `cpu`, `cuda`, `cuda:N`",
     [](Section& s, Config& c) {
      s.get("device", c.device);
      if (!valid_device(c.device))
        s.fail("device", "expected auto, cpu, cuda or cuda:N, got '" + c.device + "'",
               c.device == "gpu" || c.device.starts_with("gpu:")
                   ? "; did you mean 'cuda" + c.device.substr(3) + "'?"
                   : "");
     },
     [](const Config& c) -> std::string { return quote(c.device); }},
    {"model", "kind", "string",
     "the model `train` builds: a registered model kind (`app/registry.h`), which reads the keys below and may add its own; a program that hands the trainer its own model still sets `model.input` and `model.classes` for synthetic data",
     "`mlp`",
     [](Section& s, Config& c) {
      read_model_kind(s, c);
     },
     [](const Config& c) -> std::string { return quote(c.model.kind); }},
    {"model", "input", "int",
     "features per sample",
     "1 … 2^24",
     [](Section& s, Config& c) {
      s.get("input", c.model.input);
      s.require("input", c.model.input, c.model.input >= 1, "must be at least 1");
      s.require("input", c.model.input, c.model.input <= kMaxWidth, kMaxWidthText);
     },
     [](const Config& c) -> std::string { return std::to_string(c.model.input); }},
    {"model", "hidden", "list of int",
     "hidden layer widths; `[]` is a linear model",
     "at most 1024 layers, each 1 … 2^24",
     [](Section& s, Config& c) {
      read_model_hidden(s, c);
     },
     [](const Config& c) -> std::string { return ints(c.model.hidden); }},
    {"model", "classes", "int",
     "output classes",
     "2 … 2^24",
     [](Section& s, Config& c) {
      s.get("classes", c.model.classes);
      s.require("classes", c.model.classes, c.model.classes >= 2, "must be at least 2");
      s.require("classes", c.model.classes, c.model.classes <= kMaxWidth, kMaxWidthText);
     },
     [](const Config& c) -> std::string { return std::to_string(c.model.classes); }},
    {"model", "norm", "string",
     "normalization in each hidden layer",
     "`rms_norm`, `none`",
     [](Section& s, Config& c) {
      s.choice("norm", c.model.norm, {"rms_norm", "none"});
     },
     [](const Config& c) -> std::string { return quote(c.model.norm); }},
    {"model", "activation", "string",
     "activation after each hidden layer",
     "`scaled_silu`, `relu`",
     [](Section& s, Config& c) {
      s.choice("activation", c.model.activation, {"scaled_silu", "relu"});
     },
     [](const Config& c) -> std::string { return quote(c.model.activation); }},
    {"model", "bias", "bool",
     "linear layers have a bias",
     "",
     [](Section& s, Config& c) {
      s.get("bias", c.model.bias);
     },
     [](const Config& c) -> std::string { return flag(c.model.bias); }},
    {"data", "kind", "string",
     "where samples come from: a registered data kind (`app/registry.h`), which may add keys of its own",
     "`synthetic`, `mnist`, `csv`",
     [](Section& s, Config& c) {
      read_data_kind(s, c);
     },
     [](const Config& c) -> std::string { return quote(c.data.kind); }},
    {"data", "samples", "int",
     "synthetic: number of training samples generated (and a fifth as many for the test set)",
     "1 … 2^32; synthetic: ≥ 5, and ≥ `optim.batch_size` after `val_fraction`",
     [](Section& s, Config& c) {
      s.get("samples", c.data.samples);
      s.require("samples", c.data.samples, c.data.samples >= 1, "must be at least 1");
      s.require("samples", c.data.samples, c.data.samples <= kMaxSamples, kMaxSamplesText);
     },
     [](const Config& c) -> std::string { return std::to_string(c.data.samples); }},
    {"data", "noise", "number",
     "synthetic: noise added to the features",
     "≥ 0",
     [](Section& s, Config& c) {
      s.get("noise", c.data.noise);
      s.require("noise", c.data.noise, c.data.noise >= 0, "must be >= 0");
     },
     [](const Config& c) -> std::string { return format_number(c.data.noise); }},
    {"data", "path", "string",
     "mnist / csv: the training data; text: the text file; tokens: the llm.c token shard, or a glob pattern of shards (`fineweb_train_*.bin`) read in name order as one stream",
     "must exist for `mnist` and `csv`; a regular file for `csv`, `text` and `tokens` (a pattern: every match, and at least one)",
     [](Section& s, Config& c) {
      s.get("path", c.data.path);
     },
     [](const Config& c) -> std::string { return quote(c.data.path); }},
    {"data", "test_path", "string",
     "mnist / csv: optional held-out test data",
     "must exist if set; a regular file for `csv`",
     [](Section& s, Config& c) {
      s.get("test_path", c.data.test_path);
     },
     [](const Config& c) -> std::string { return quote(c.data.test_path); }},
    {"data", "test_fraction", "number",
     "mnist / csv: share of `data.path`'s samples held out as the test set (`round(test_fraction · size)`, a seeded draw by `data.seed`), for data that has no test file; `data.val_fraction` then splits the rest; `train eval` holds out the same rows",
     "in [0, 1); 0 (none) with `data.test_path`, and for `synthetic`, which draws its own test set",
     [](Section& s, Config& c) {
      s.get("test_fraction", c.data.test_fraction);
      s.require("test_fraction", c.data.test_fraction,
                c.data.test_fraction >= 0 && c.data.test_fraction < 1, "must be in [0, 1)");
     },
     [](const Config& c) -> std::string { return format_number(c.data.test_fraction); }},
    {"data", "label_column", "int",
     "csv: column holding the label, from 0; `-1` = last",
     "-1 … 2^24",
     [](Section& s, Config& c) {
      s.get("label_column", c.data.label_column);
      s.require("label_column", c.data.label_column, c.data.label_column >= -1,
                "must be -1 (the last column) or a column index from 0");
      s.require("label_column", c.data.label_column, c.data.label_column <= kMaxWidth, kMaxWidthText);
     },
     [](const Config& c) -> std::string { return std::to_string(c.data.label_column); }},
    {"data", "header", "string",
     "csv: whether the first line is a header to skip; `auto` decides for each file (train, test, predict's input) on its own: a first line with no number in it is a header",
     "`auto`, `true`, `false`",
     [](Section& s, Config& c) {
      s.choice("header", c.data.header, {"auto", "true", "false"});
     },
     [](const Config& c) -> std::string { return c.data.header; }},
    {"data", "standardize", "bool",
     "scale every feature to mean 0, std 1 with the mean and (population) std of the training split, never the validation or test rows; the statistics are saved in each checkpoint and `train eval` / `train predict` apply them to their data",
     "",
     [](Section& s, Config& c) {
      s.get("standardize", c.data.standardize);
     },
     [](const Config& c) -> std::string { return flag(c.data.standardize); }},
    {"data", "val_fraction", "number",
     "share of the training data held out for validation (`round(val_fraction · size)` samples)",
     "in [0, 1); if > 0 it must hold out at least one sample",
     [](Section& s, Config& c) {
      s.get("val_fraction", c.data.val_fraction);
      s.require("val_fraction", c.data.val_fraction, c.data.val_fraction >= 0 && c.data.val_fraction < 1,
                "must be in [0, 1)");
     },
     [](const Config& c) -> std::string { return format_number(c.data.val_fraction); }},
    {"data", "shuffle", "bool",
     "reshuffle the training data every epoch",
     "",
     [](Section& s, Config& c) {
      s.get("shuffle", c.data.shuffle);
     },
     [](const Config& c) -> std::string { return flag(c.data.shuffle); }},
    {"data", "seed", "int",
     "seed for shuffling and for the synthetic data",
     "≥ 0",
     [](Section& s, Config& c) {
      s.get("seed", c.data.seed);
     },
     [](const Config& c) -> std::string { return std::to_string(c.data.seed); }},
    {"optim", "name", "string",
     "optimizer",
     "`adamw`, `sgd`",
     [](Section& s, Config& c) {
      s.get("name", c.optim.name);
     },
     [](const Config& c) -> std::string { return quote(c.optim.name); }},
    {"optim", "lr", "number",
     "peak learning rate",
     "> 0",
     [](Section& s, Config& c) {
      s.get("lr", c.optim.lr);
     },
     [](const Config& c) -> std::string { return format_number(c.optim.lr); }},
    {"optim", "weight_decay", "number",
     "weight decay (decoupled for AdamW), of the weights of 2 or more dimensions only: biases, norm gains and other 1-D parameters get none (nanoGPT's groups), with SGD too",
     "≥ 0",
     [](Section& s, Config& c) {
      s.get("weight_decay", c.optim.weight_decay);
     },
     [](const Config& c) -> std::string { return format_number(c.optim.weight_decay); }},
    {"optim", "betas", "[number, number]",
     "AdamW moment decay rates",
     "each in [0, 1)",
     [](Section& s, Config& c) {
      s.get("betas", c.optim.betas);
     },
     [](const Config& c) -> std::string { return "[" + format_number(c.optim.betas[0]) + ", " + format_number(c.optim.betas[1]) + "]"; }},
    {"optim", "eps", "number",
     "AdamW denominator epsilon",
     "> 0",
     [](Section& s, Config& c) {
      s.get("eps", c.optim.eps);
     },
     [](const Config& c) -> std::string { return format_number(c.optim.eps); }},
    {"optim", "momentum", "number",
     "SGD momentum",
     "in [0, 1)",
     [](Section& s, Config& c) {
      s.get("momentum", c.optim.momentum);
     },
     [](const Config& c) -> std::string { return format_number(c.optim.momentum); }},
    {"optim", "nesterov", "bool",
     "SGD Nesterov momentum",
     "needs `momentum` > 0",
     [](Section& s, Config& c) {
      s.get("nesterov", c.optim.nesterov);
     },
     [](const Config& c) -> std::string { return flag(c.optim.nesterov); }},
    {"optim", "shard_state", "bool",
     "data parallel: shard AdamW's state over the ranks (ZeRO-1, [distributed.md](distributed.md#zero-1-sharded-optimizer-state))",
     "needs `name: adamw`",
     [](Section& s, Config& c) {
      s.get("shard_state", c.optim.shard_state);
     },
     [](const Config& c) -> std::string { return flag(c.optim.shard_state); }},
    {"optim", "schedule", "string",
     "learning-rate schedule after warmup",
     "`constant`, `cosine`",
     [](Section& s, Config& c) {
      s.get("schedule", c.optim.schedule);
     },
     [](const Config& c) -> std::string { return quote(c.optim.schedule); }},
    {"optim", "warmup_steps", "int",
     "linear warmup: step s < warmup uses `lr · (s + 1) / warmup_steps`; one longer than the run is shortened to the run's length, with a warning (so `--set optim.steps=10` is a smoke run)",
     "≥ 0",
     [](Section& s, Config& c) {
      s.get("warmup_steps", c.optim.warmup_steps);
     },
     [](const Config& c) -> std::string { return std::to_string(c.optim.warmup_steps); }},
    {"optim", "min_lr", "number",
     "where the cosine schedule ends",
     "≥ 0, ≤ `lr`",
     [](Section& s, Config& c) {
      s.get("min_lr", c.optim.min_lr);
     },
     [](const Config& c) -> std::string { return format_number(c.optim.min_lr); }},
    {"optim", "steps", "int",
     "optimizer steps to train for",
     "≥ 1",
     [](Section& s, Config& c) {
      s.get("steps", c.optim.steps);
     },
     [](const Config& c) -> std::string { return std::to_string(c.optim.steps); }},
    {"optim", "epochs", "int",
     "if > 0, train this many passes over the training split instead: `steps = epochs · floor(train samples / batch_size)`, logged at the start; `steps` is then not used",
     "0 … 2^32",
     [](Section& s, Config& c) {
      s.get("epochs", c.optim.epochs);
     },
     [](const Config& c) -> std::string { return std::to_string(c.optim.epochs); }},
    {"optim", "batch_size", "int",
     "samples per optimizer step",
     "1 … 2^32",
     [](Section& s, Config& c) {
      s.get("batch_size", c.optim.batch_size);
      s.require("batch_size", c.optim.batch_size, c.optim.batch_size >= 1, "must be at least 1");
      s.require("batch_size", c.optim.batch_size, c.optim.batch_size <= kMaxSamples, kMaxSamplesText);
     },
     [](const Config& c) -> std::string { return std::to_string(c.optim.batch_size); }},
    {"optim", "microbatches", "int",
     "backward passes the batch is split into (gradient accumulation)",
     "≥ 1, ≤ `batch_size`",
     [](Section& s, Config& c) {
      s.get("microbatches", c.optim.microbatches);
      s.require("microbatches", c.optim.microbatches, c.optim.microbatches >= 1, "must be at least 1");
     },
     [](const Config& c) -> std::string { return std::to_string(c.optim.microbatches); }},
    {"optim", "clip_norm", "number",
     "clip the global gradient norm to this; `0` = no clipping",
     "≥ 0",
     [](Section& s, Config& c) {
      s.get("clip_norm", c.optim.clip_norm);
     },
     [](const Config& c) -> std::string { return format_number(c.optim.clip_norm); }},
    {"precision", "compute_dtype", "string",
     "dtype of activations and matmuls; parameters and gradients stay f32",
     "`f64` (CPU only), `f32`, `bf16`, `f16`",
     [](Section& s, Config& c) {
      std::string dtype = dtype_name(c.precision.compute_dtype);
      s.choice("compute_dtype", dtype, {"f64", "f32", "bf16", "f16"});
      c.precision.compute_dtype = dtype_from_name(dtype);
     },
     [](const Config& c) -> std::string { return dtype_name(c.precision.compute_dtype); }},
    {"precision", "deterministic", "bool",
     "deterministic (two-pass) reductions instead of atomics",
     "",
     [](Section& s, Config& c) {
      s.get("deterministic", c.precision.deterministic);
     },
     [](const Config& c) -> std::string { return flag(c.precision.deterministic); }},
    {"precision", "gemm_autotune", "bool",
     "CUDA: choose each GEMM shape's cuBLASLt algorithm by timing the heuristic's first 8 candidates once (faster for some shapes; another run may pick another algorithm, so its bits may differ) instead of taking the first",
     "",
     [](Section& s, Config& c) {
      s.get("gemm_autotune", c.precision.gemm_autotune);
     },
     [](const Config& c) -> std::string { return flag(c.precision.gemm_autotune); }},
    {"precision", "loss_scale", "`dynamic` \\| `none` \\| number",
     "f16 loss scaling: adaptive, off, or a fixed scale; bf16, f32 and f64 never scale ([precision.md](precision.md))",
     "a fixed scale in (0, 2^40]",
     [](Section& s, Config& c) {
      read_loss_scale(s, c.precision);
     },
     [](const Config& c) -> std::string { return c.precision.loss_scale == "fixed" ? format_number(c.precision.fixed_loss_scale) : c.precision.loss_scale; }},
    {"precision", "initial_scale", "number",
     "dynamic: the scale the run starts from (2^16)",
     "1 to 2^40",
     [](Section& s, Config& c) {
      s.get("initial_scale", c.precision.initial_scale);
      s.require("initial_scale", c.precision.initial_scale, c.precision.initial_scale >= 1, "must be at least 1");
      s.require("initial_scale", c.precision.initial_scale, c.precision.initial_scale <= kMaxLossScale,
                "must be at most 2^40 (" + kMaxLossScaleWhy + ")");
     },
     [](const Config& c) -> std::string { return format_number(c.precision.initial_scale); }},
    {"precision", "growth_interval", "int",
     "dynamic: steps without overflow before the scale doubles",
     "≥ 1",
     [](Section& s, Config& c) {
      s.get("growth_interval", c.precision.growth_interval);
      s.require("growth_interval", c.precision.growth_interval, c.precision.growth_interval >= 1, "must be at least 1");
     },
     [](const Config& c) -> std::string { return std::to_string(c.precision.growth_interval); }},
    {"eval", "every", "int",
     "optimizer steps between validation passes",
     "≥ 1",
     [](Section& s, Config& c) {
      s.get("every", c.eval.every);
     },
     [](const Config& c) -> std::string { return std::to_string(c.eval.every); }},
    {"eval", "batch_size", "int",
     "samples per evaluation batch",
     "1 … 2^32",
     [](Section& s, Config& c) {
      s.get("batch_size", c.eval.batch_size);
     },
     [](const Config& c) -> std::string { return std::to_string(c.eval.batch_size); }},
    {"checkpoint", "dir", "string",
     "directory for checkpoints (and, by default, logs)",
     "not empty; creatable and writable (checked at start-up)",
     [](Section& s, Config& c) {
      s.get("dir", c.checkpoint.dir);
     },
     [](const Config& c) -> std::string { return quote(c.checkpoint.dir); }},
    {"checkpoint", "every", "int",
     "optimizer steps between checkpoints",
     "≥ 1",
     [](Section& s, Config& c) {
      s.get("every", c.checkpoint.every);
     },
     [](const Config& c) -> std::string { return std::to_string(c.checkpoint.every); }},
    {"checkpoint", "keep_last", "int",
     "checkpoints of this run kept; its older ones are deleted",
     "≥ 1",
     [](Section& s, Config& c) {
      s.get("keep_last", c.checkpoint.keep_last);
     },
     [](const Config& c) -> std::string { return std::to_string(c.checkpoint.keep_last); }},
    {"checkpoint", "keep_best", "bool",
     "also keep the step of the lowest validation loss as `best.safetensors` in `dir`, never pruned; `--resume DIR` still continues from the newest checkpoint, `--resume DIR/best.safetensors` from the best, and `train eval` / `train sample` read either",
     "",
     [](Section& s, Config& c) {
      s.get("keep_best", c.checkpoint.keep_best);
     },
     [](const Config& c) -> std::string { return flag(c.checkpoint.keep_best); }},
    {"checkpoint", "overwrite", "bool",
     "a run into a `dir` that holds another run's checkpoints or metrics deletes them first, instead of stopping (docs/robustness.md)",
     "",
     [](Section& s, Config& c) {
      s.get("overwrite", c.checkpoint.overwrite);
     },
     [](const Config& c) -> std::string { return flag(c.checkpoint.overwrite); }},
    {"logging", "every", "int",
     "optimizer steps between log lines; the loss and gradient norm are checked for NaN/inf at these steps and at checkpoints (`1` checks every step: [robustness.md](robustness.md))",
     "≥ 1",
     [](Section& s, Config& c) {
      s.get("every", c.logging.every);
     },
     [](const Config& c) -> std::string { return std::to_string(c.logging.every); }},
    {"logging", "metrics", "string",
     "JSON-lines metrics file; empty = `<checkpoint.dir>/metrics.jsonl`",
     "",
     [](Section& s, Config& c) {
      s.get("metrics", c.logging.metrics);
     },
     [](const Config& c) -> std::string { return quote(c.logging.metrics); }},
    {"logging", "curve", "string",
     "SVG loss curve; empty = `<checkpoint.dir>/curve.svg`",
     "",
     [](Section& s, Config& c) {
      s.get("curve", c.logging.curve);
     },
     [](const Config& c) -> std::string { return quote(c.logging.curve); }},
    {"", "cuda_graph", "bool",
     "replay every step that is not logged or saved as one CUDA graph, recorded after the first step (docs/perf.md); where it cannot (CPU, sgd, f16 loss scaling, data parallel) a warning says why and steps run eagerly",
     "",
     [](Section& s, Config& c) {
      s.get("cuda_graph", c.cuda_graph);
     },
     [](const Config& c) -> std::string { return flag(c.cuda_graph); }},
  };
  return all;
}

// ---- a kind's own keys --------------------------------------------------------------------------

const char* type_name(ParamType t) {
  switch (t) {
    case ParamType::integer: return "int";
    case ParamType::number: return "number";
    case ParamType::boolean: return "bool";
    case ParamType::string: return "string";
    case ParamType::integers: return "list of int";
  }
  return "?";
}

// The value of `key` as YAML text (a string quoted).
std::string param_yaml(const app::ParamKey& key, const Params& p) {
  return key.type == ParamType::string ? quote(p.string(key.name)) : p.text(key.name);
}

// Reads the kind's keys in order into `params`, each from the section or its default.
void read_params(Section& s, const std::vector<app::ParamKey>& keys, Params& params) {
  params.values.clear();
  for (const app::ParamKey& key : keys) {
    Params defaults{{{key.name, key.default_value}}};
    std::string text;
    switch (key.type) {
      case ParamType::integer: {
        int64_t v = defaults.integer(key.name);
        s.get(key.name, v);
        text = std::to_string(v);
        break;
      }
      case ParamType::number: {
        double v = defaults.number(key.name);
        s.get(key.name, v);
        text = format_number(v);
        break;
      }
      case ParamType::boolean: {
        bool v = defaults.boolean(key.name);
        s.get(key.name, v);
        text = flag(v);
        break;
      }
      case ParamType::string: {
        std::string v = key.default_value;
        s.get(key.name, v);
        text = v;
        break;
      }
      case ParamType::integers: {
        std::vector<int64_t> v = defaults.integers(key.name);
        s.get(key.name, v);
        text = ints(v);
        break;
      }
    }
    params.values.emplace_back(key.name, text);
    if (!key.check) continue;
    if (const std::string what = key.check(params); !what.empty())
      s.fail(key.name, what + ", got " + (key.type == ParamType::string ? "'" + text + "'" : text));
  }
}

const app::ModelKind* model_kind_of(const Config& c) { return app::find_model_kind(c.model.kind); }
const app::DataKind* data_kind_of(const Config& c) { return app::find_data_kind(c.data.kind); }

// ---- reading --------------------------------------------------------------------------------------

// data.test_fraction holds a test set out of a dataset that has none of its own.
void check_test_fraction(Section& s, const DataConfig& d, const app::DataKind& kind) {
  if (d.test_fraction == 0) return;
  if (!kind.load)
    s.fail("test_fraction", "data.kind " + d.kind + " serves batches of its own, with no test set "
                            "to hold out, got " + format_number(d.test_fraction));
  if (!d.test_path.empty())
    s.fail("test_fraction", "data.test_path already gives the test set; set one of the two, got " +
                                format_number(d.test_fraction));
  if (kind.has_test && kind.has_test(d))
    s.fail("test_fraction", "data.kind " + d.kind + " has a test set of its own" +
                                (d.kind == "synthetic" ? " (a fifth of data.samples, drawn apart)" : "") +
                                ", got " + format_number(d.test_fraction));
}

// The rows of `section`, in order, each value checked as it is read: by the row's own checks,
// then by the rules train::validate has for it (train/rules.h), so that a value a program of its
// own could set in train::Options gets the same message from both.
void read_rows(Section& s, Config& c, const std::string& section) {
  for (const Row& row : rows()) {
    if (section != row.section) continue;
    row.read(s, c);
    s.check(row.key, c);
  }
}

Config read_config(const Origin& origin, const YAML::Node& root) {
  Config c;
  Section top(origin, root, "");
  read_rows(top, c, "");

  Section model = top.section("model");
  read_rows(model, c, "model");
  read_params(model, app::model_kind(c.model.kind).keys, c.model.params);
  model.finish();

  Section data = top.section("data");
  read_rows(data, c, "data");
  const app::DataKind& data_kind = app::data_kind(c.data.kind);
  read_params(data, data_kind.keys, c.data.params);
  data.finish();
  check_test_fraction(data, c.data, data_kind);

  Section optim = top.section("optim");
  read_rows(optim, c, "optim");
  optim.finish();
  // Checks between keys come after finish(), so a misspelled key is reported as that rather than
  // as a conflict with the default it failed to replace.
  const OptimConfig& o = c.optim;
  optim.require("microbatches", o.microbatches, o.microbatches <= o.batch_size,
                "must not exceed optim.batch_size = " + std::to_string(o.batch_size));
  optim.check_between(c);  // optim.min_lr against optim.lr, ... (train/rules.h)
  // The data kind's checks (files that must exist, sizes that follow from the config alone).
  if (data_kind.check)
    data_kind.check(c, [&](const std::string& key, const std::string& what) { data.fail(key, what); });

  Section precision = top.section("precision");
  read_rows(precision, c, "precision");
  precision.finish();
  if (c.precision.compute_dtype == DType::f64 && c.device.starts_with("cuda"))
    precision.fail("compute_dtype", "f64 runs on the CPU only, but device is " + c.device);

  for (const char* name : {"eval", "checkpoint", "logging"}) {
    Section s = top.section(name);
    read_rows(s, c, name);
    s.finish();
  }
  top.finish();
  return c;
}

}  // namespace

bool valid_device(const std::string& d) {
  if (d == "auto" || d == "cpu" || d == "cuda") return true;
  if (!d.starts_with("cuda:") || d.size() == 5 || d.size() > 8) return false;
  return std::all_of(d.begin() + 5, d.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Config parse_config(const std::string& text, const std::string& name,
                    const std::vector<std::string>& overrides) {
  // YAML allows a byte order mark at the start. yaml-cpp 0.7 skips it; one that does not would
  // glue it to the first key (seen by an audit), so it is not left to the library.
  const std::string yaml = text.starts_with("\xef\xbb\xbf") ? text.substr(3) : text;
  Origin origin{name, yaml, {}};
  YAML::Node root;
  try {
    if (const size_t second = second_document_line(yaml))
      throw ConfigError(name + ":" + std::to_string(second) +
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
  const std::string limit = std::to_string(kMaxConfigBytes) + " bytes (1 MiB)";
  const bool regular = regular_file(path);
  if (regular) {
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec && size > kMaxConfigBytes)
      throw ConfigError("config file " + path + " is " + std::to_string(size) +
                        " bytes; a config may have at most " + limit);
  }
  if (special_file_kind(path).starts_with("a FIFO"))  // opening it would wait for a writer
    throw ConfigError("config file " + path + " is a FIFO (named pipe): give a regular file");
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
  std::ostringstream y;
  std::string section;
  // A kind's own keys end its section.
  auto end_section = [&] {
    const std::vector<app::ParamKey>* keys = nullptr;
    const Params* params = nullptr;
    if (section == "model" && model_kind_of(c)) keys = &model_kind_of(c)->keys, params = &c.model.params;
    if (section == "data" && data_kind_of(c)) keys = &data_kind_of(c)->keys, params = &c.data.params;
    if (keys)
      for (const app::ParamKey& k : *keys) y << "  " << k.name << ": " << param_yaml(k, *params) << "\n";
  };
  for (const Row& row : rows()) {
    if (section != row.section) {
      end_section();
      section = row.section;
      if (!section.empty()) y << section << ":\n";
    }
    y << (section.empty() ? "" : "  ") << row.key << ": " << row.write(c) << "\n";
  }
  end_section();
  return y.str();
}

std::string reference_table() {
  // A default as the reference shows it: strings without their quotes, the empty one as "".
  auto shown = [](std::string v) {
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
    return "`" + (v.empty() ? std::string("\"\"") : v) + "`";
  };
  auto cell = [](const std::string& text) { return text.empty() ? text : text + " "; };
  auto kinds = [](const auto& all) {
    std::string list;
    for (const auto* k : all)
      if (k->documented) list += (list.empty() ? "`" : ", `") + k->name + "`";
    return list;
  };
  // A kind's keys, each row led by the kinds that have it: kinds with the same key (type,
  // default, meaning and constraints alike) share one row.
  auto kind_rows = [&](const std::string& section, const auto& all) {
    std::vector<std::pair<std::string, std::string>> rows;  // (kinds, the row after the meaning's kinds)
    for (const auto* k : all) {
      if (!k->documented) continue;
      for (const app::ParamKey& key : k->keys) {
        const Params p{{{key.name, key.default_value}}};
        const std::string lead = "| `" + section + "." + key.name + "` | " + type_name(key.type) +
                                 " | " + shown(param_yaml(key, p)) + " | ";
        const std::string rest = key.meaning + " | " + cell(key.constraints) + "|\n";
        auto same = std::find_if(rows.begin(), rows.end(), [&](const auto& r) {
          return r.second == lead + "\x01" + rest;
        });
        if (same != rows.end()) same->first += ", " + k->name;
        else rows.emplace_back(k->name, lead + "\x01" + rest);
      }
    }
    std::string out;
    for (const auto& [kinds, row] : rows) {
      const size_t at = row.find('\x01');
      out += row.substr(0, at) + kinds + ": " + row.substr(at + 1);
    }
    return out;
  };
  const Config defaults;
  std::string t = "| key | type | default | meaning | constraints |\n|---|---|---|---|---|\n";
  std::string section;
  for (const Row& row : rows()) {
    if (section != row.section) {
      if (section == "model") t += kind_rows("model", app::model_kinds());
      if (section == "data") t += kind_rows("data", app::data_kinds());
      section = row.section;
    }
    const std::string key = section.empty() ? row.key : section + "." + row.key;
    std::string constraints = row.constraints;
    if (key == "model.kind") constraints = kinds(app::model_kinds());
    if (key == "data.kind") constraints = kinds(app::data_kinds());
    t += "| `" + key + "` | " + row.type + " | " + shown(row.write(defaults)) + " | " + row.meaning +
         " | " + cell(constraints) + "|\n";
  }
  return t;
}

const std::string& Params::text(const std::string& key) const {
  for (const auto& [k, v] : values)
    if (k == key) return v;
  MT_THROW("config: no key '", key, "' among the kind's own keys");
}

int64_t Params::integer(const std::string& key) const {
  int64_t v = 0;
  MT_CHECK(parse_number(text(key), v), "config: '", key, "' is not an integer: ", text(key));
  return v;
}

double Params::number(const std::string& key) const {
  double v = 0;
  MT_CHECK(parse_double(text(key), v), "config: '", key, "' is not a number: ", text(key));
  return v;
}

bool Params::boolean(const std::string& key) const {
  bool v = false;
  MT_CHECK(parse_bool(text(key), v), "config: '", key, "' is not true or false: ", text(key));
  return v;
}

std::string Params::string(const std::string& key) const { return text(key); }

std::vector<int64_t> Params::integers(const std::string& key) const {
  const std::string& t = text(key);
  MT_CHECK(t.size() >= 2 && t.front() == '[' && t.back() == ']', "config: '", key,
           "' is not a list of integers: ", t);
  std::vector<int64_t> out;
  std::stringstream items(t.substr(1, t.size() - 2));
  for (std::string item; std::getline(items, item, ',');) {
    const size_t b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
    int64_t v = 0;
    MT_CHECK(b != std::string::npos && parse_number(item.substr(b, e - b + 1), v), "config: '", key,
             "' is not a list of integers: ", t);
    out.push_back(v);
  }
  return out;
}

std::string format_number(double v) { return format_double(v); }

}  // namespace mt

namespace mt::app {
namespace {

optim::LossScalerOptions loss_scale(const PrecisionConfig& p) {
  if (p.loss_scale == "none") return {optim::LossScaleMode::none};
  if (p.loss_scale == "fixed") return {optim::LossScaleMode::fixed, p.fixed_loss_scale, p.growth_interval};
  return {optim::LossScaleMode::dynamic, p.initial_scale, p.growth_interval};
}

}  // namespace

train::Options options_from(const Config& c) {
  train::Options o;
  o.steps = c.optim.steps;
  o.epochs = c.optim.epochs;
  o.optimizer = {c.optim.name, c.optim.lr, c.optim.weight_decay, c.optim.betas, c.optim.eps,
                 c.optim.momentum, c.optim.nesterov, c.optim.shard_state, c.optim.clip_norm};
  o.schedule = {c.optim.schedule, c.optim.warmup_steps, c.optim.min_lr};
  o.precision = {c.precision.compute_dtype, c.precision.deterministic, c.precision.gemm_autotune,
                 loss_scale(c.precision)};
  o.eval = {c.eval.every, c.eval.batch_size};
  o.checkpoint = {c.checkpoint.dir, c.checkpoint.every, c.checkpoint.keep_last,
                  c.checkpoint.keep_best, c.checkpoint.overwrite, {}};
  o.logging = {c.logging.every, c.logging.metrics, c.logging.curve};
  o.cuda_graph = c.cuda_graph;
  return o;
}

}  // namespace mt::app
