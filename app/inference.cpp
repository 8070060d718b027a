#include "app/inference.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <spdlog/fmt/fmt.h>
#include <yaml-cpp/yaml.h>

#include "app/config_trainer.h"
#include "app/registry.h"
#include "core/atomic_file.h"
#include "core/autograd.h"
#include "core/input_file.h"
#include "core/registry.h"
#include "core/switches.h"
#include "data/csv.h"
#include "data/data.h"
#include "nn/serialize.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/task.h"
#include "train/trainer.h"

namespace mt::app {

using train::Evaluation;
using train::CheckpointError;
using train::newest_that_reads;

namespace {

// The keys an override may set: what to run on and which data, never the model.
void check_overrides(const std::vector<std::string>& overrides) {
  for (const std::string& o : overrides) {
    const std::string key = o.substr(0, o.find('='));
    if (!key.starts_with("data.") && !key.starts_with("eval.") && key != "device")
      throw ConfigError("--set " + o + ": a saved model takes overrides of data.*, eval.* and " +
                        "device only (the model and its training are the checkpoint's)");
  }
}

// The model.kind a saved config names ("" when it names none or is not YAML: parse_config then
// says what is wrong).
std::string model_kind_of(const std::string& yaml) {
  try {
    const YAML::Node kind = YAML::Load(yaml)["model"]["kind"];
    return kind && kind.IsScalar() ? kind.Scalar() : "";
  } catch (const YAML::Exception&) {
    return "";
  }
}

std::string kind_names() {
  std::string names;
  for (const ModelKind* k : model_kinds()) names += (names.empty() ? "" : ", ") + k->name;
  return names;
}

// Where a program's own model is loaded, for the errors that point there.
const std::string kOwnInference = "docs/library.md, \"Inference for your own model\"";

// The logits of `x` [n, input] f32, in the run's compute dtype, without a graph.
Tensor forward(const SavedModel& m, const Tensor& x) {
  return (*m.model)(x.to(m.config.precision.compute_dtype));
}

// The row's largest logit, the first on ties (as the trainer counts accuracy).
size_t argmax(const double* row, size_t n) { return size_t(std::max_element(row, row + n) - row); }

// One model file, every checksum verified, holding a model this program can rebuild.
ModelFile read_one_model_file(const std::string& path) {
  ModelFile f;
  f.path = path;
  try {
    f.file = nn::load_tensors(f.path);
  } catch (const Error& e) {
    throw InferenceError(e.what());
  }
  // A model only the program that trained it can build: say so, and where that is written up.
  if (f.file.metadata.find("config") == f.file.metadata.end())
    throw InferenceError(f.path + ": has no 'config' in its metadata: not a model file `train` "
                         "saved (a program's own run loads its model itself: " + kOwnInference +
                         ")");
  if (auto own = f.file.metadata.find(kOwnModelKey); own != f.file.metadata.end())
    throw InferenceError(f.path + ": holds " + own->second + ", a model of the program that "
                         "trained it, not one its config's model section describes, so it cannot "
                         "be rebuilt here; load it in that program (" + kOwnInference + ")");
  for (const auto& [name, t] : f.file.tensors)  // a run never saves one: damage, as --resume says
    for (double v : t.to_vector())
      if (!std::isfinite(v))
        throw InferenceError(detail::concat(f.path, ": parameter '", name, "' holds ", v,
                                            ": not a model to use"));
  return f;
}

}  // namespace

ModelFile read_model_file(const std::string& checkpoint) {
  std::error_code ec;
  if (!std::filesystem::is_directory(checkpoint, ec)) return read_one_model_file(checkpoint);
  // A directory: its newest model file that reads, as --resume DIR picks, except that using a
  // model needs no optimizer state, so a checkpoint whose optimizer file is lost still serves
  // (--resume would fall back to the one before).
  ModelFile f;
  try {
    newest_that_reads(checkpoint, [&](const std::string& path) { f = read_one_model_file(path); });
  } catch (const CheckpointError& e) {
    throw InferenceError(e.what());
  }
  return f;
}

SavedModel load_saved_model(const std::string& checkpoint, const std::vector<std::string>& overrides) {
  check_overrides(overrides);
  SavedModel m;
  const ModelFile mf = read_model_file(checkpoint);
  m.path = mf.path;
  const nn::TensorFile& file = mf.file;
  const auto config = file.metadata.find("config");
  if (const std::string kind = model_kind_of(config->second); !kind.empty() && !find_model_kind(kind))
    throw InferenceError(m.path + ": its model.kind '" + kind + "' is not registered in this "
                         "program (it has " + kind_names() + "); evaluate it with the program that "
                         "registered it, which can call app::evaluate_checkpoint and "
                         "app::predict_csv (" + kOwnInference + ")");
  m.config = parse_config(config->second, m.path + " (its config)", overrides);
  if (auto st = file.metadata.find("standardization"); st != file.metadata.end())
    m.standardization = data::standardization_from_text(st->second, m.path);
  if (m.config.data.standardize && m.standardization.empty())
    throw InferenceError(m.path + ": its config has data.standardize but the file holds no "
                         "feature statistics");
  const Config& c = m.config;
  m.device = train::resolve_device(c.device);
  set_deterministic(c.precision.deterministic);
  set_gemm_autotune(c.precision.gemm_autotune);
  // Placed as the trainer places it, so the arithmetic is the run's.
  m.model = build_model(c);
  if (c.precision.compute_dtype == DType::f64) m.model->to(DType::f64);
  m.model->to(m.device);
  if (c.precision.compute_dtype != DType::f64) m.model->set_compute_dtype(c.precision.compute_dtype);
  try {
    m.model->load_state_dict(file.tensors);
  } catch (const Error& e) {
    throw InferenceError(m.path + ": does not fit the model its config describes: " + e.what());
  }
  m.model->eval();
  return m;
}

namespace {

// Token data (a data kind with a source of its own, app/registry.h) has a validation split and no
// test set: the model's own task (the language model's loss, bits per byte and perplexity) over
// the windows the run validated on.
CheckpointEvaluation evaluate_source(const SavedModel& m, const DataKind& kind, const std::string& split) {
  const Config& c = m.config;
  if (split == "test")
    throw ConfigError("--split test: data.kind " + c.data.kind + " has no test set; its held-out "
                      "part is the validation split (--split val, the default for it)");
  const std::shared_ptr<data::Source> source = kind.source(c);
  const ModelKind& model = model_kind(c.model.kind);
  const std::shared_ptr<train::Task> task = model.task ? model.task(c, *source) : train::classification();
  CheckpointEvaluation e;
  e.split = "val";
  e.unit = "windows";
  e.samples = source->held_out_size(data::HeldOut::validation);
  if (e.samples == 0)
    throw ConfigError(detail::concat("data.val_fraction: ", c.data.val_fraction,
                                     " holds out no validation windows"));
  static_cast<Evaluation&>(e) = train::evaluate(*m.model, *task, *source, data::HeldOut::validation,
                                                c.eval.batch_size, m.device, c.precision.compute_dtype);
  return e;
}

}  // namespace

CheckpointEvaluation evaluate_checkpoint(const std::string& checkpoint, const std::vector<std::string>& overrides,
                               const std::string& chosen_split) {
  if (!chosen_split.empty() && chosen_split != "test" && chosen_split != "val")
    throw ConfigError("--split: expected test or val, got '" + chosen_split + "'");
  const SavedModel m = load_saved_model(checkpoint, overrides);
  const Config& c = m.config;
  if (const DataKind& kind = data_kind(c.data.kind); kind.source) {
    CheckpointEvaluation e = evaluate_source(m, kind, chosen_split);
    if (!std::isfinite(e.loss))
      throw train::NonFiniteError(detail::concat("val: the loss is ", e.loss));
    return e;
  }
  const std::string split = chosen_split.empty() ? "test" : chosen_split;
  if (split == "test" && !data::has_test_set(c.data))
    throw ConfigError("data.test_path: the run has no test set; give one with --set "
                      "data.test_path=FILE, or evaluate the validation split with --split val");
  data::Dataset set = data::load_dataset(c.data, c.model, split == "test");
  std::vector<int64_t> rows;
  if (split == "test") {
    for (int64_t i = 0; i < set.size; ++i) rows.push_back(i);
  } else {
    rows = data::split_indices(set.size, c.data.val_fraction, c.data.seed).val;
    if (rows.empty())
      throw ConfigError(detail::concat("data.val_fraction: ", c.data.val_fraction,
                                       " holds out none of the ", set.size, " samples"));
  }
  // The data must fit the model as the trainer requires it to (its kind's check_data).
  if (const ModelKind& kind = model_kind(c.model.kind); kind.check_data) kind.check_data(c, set);
  data::standardize(set.features, m.standardization);  // the run's statistics, not this data's

  CheckpointEvaluation e;
  static_cast<Evaluation&>(e) = train::evaluate(*m.model, *train::classification(), set, rows, c.eval.batch_size,
                                         m.device, c.precision.compute_dtype);
  e.split = split;
  e.samples = int64_t(rows.size());
  if (!std::isfinite(e.loss))
    throw train::NonFiniteError(detail::concat(split, ": the loss is ", e.loss, " (an input too large for the model?)"));
  return e;
}

std::string format_evaluation(const CheckpointEvaluation& e) {
  return fmt::format("{}: loss {}{} ({} {})", e.split, train::format_value(e.loss), train::metrics_text(e.metrics, ""),
                     e.samples, e.unit);
}

void check_output_file(const std::string& flag, const std::string& output,
                       const std::vector<std::string>& inputs) {
  struct stat st{};
  const bool exists = ::lstat(output.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) {
    const std::string kind = S_ISLNK(st.st_mode) ? "a symbolic link" : special_file_kind(output);
    throw InferenceError(flag + " " + output + " is " + kind +
                         "; it must be a new or a regular file (it is replaced whole)");
  }
  for (const std::string& in : inputs) {
    std::error_code ec;  // false, with ec set, when either does not exist
    if (std::filesystem::equivalent(output, in, ec))
      throw InferenceError(flag + " " + output + " is " + in + ", which this command reads; " +
                           "name another file");
  }
  // Neither command writes a checkpoint, a run's metrics, curve or lock, or a config: one that
  // exists at `output` is a slip (a run's file named instead of a new one beside it).
  const std::string ext = std::filesystem::path(output).extension().string();
  const std::vector<std::string> run_files = {".safetensors", ".jsonl", ".svg", ".lock", ".yaml",
                                              ".yml"};
  if (exists && std::find(run_files.begin(), run_files.end(), ext) != run_files.end())
    throw InferenceError(flag + " " + output + " exists, and a " + ext + " file is one a training " +
                         "run writes or reads (a checkpoint, its metrics, curve or lock, a " +
                         "config), never this command's output; name another file");
}

int64_t predict_csv(const std::string& checkpoint, const std::string& input,
                    const std::string& output, const std::vector<std::string>& overrides) {
  check_output_file("predict: --output", output, {input});
  const SavedModel m = load_saved_model(checkpoint, overrides);
  check_output_file("predict: --output", output, {m.path});  // the model file it came from
  const ModelConfig& mc = m.config.model;
  // A language model's input is text, not a row of features.
  if (data_kind(m.config.data.kind).source)
    throw InferenceError(m.path + ": model.kind " + mc.kind + " trained on data.kind " +
                         m.config.data.kind + " is a language model; `train predict` classifies "
                         "CSV rows. Generate text with `train sample --checkpoint " + checkpoint +
                         " --prompt TEXT`, or measure it with `train eval --checkpoint " +
                         checkpoint + "`");
  CsvData in;
  try {
    in = read_csv(input, kNoLabelColumn, csv_header(m.config.data.header, input));
  } catch (const Error& e) {
    throw data::DataError(e.what());
  }
  if (in.cols != mc.input)
    throw InferenceError(detail::concat(input, ":", in.first_line, ": the row has ", in.cols,
                                        " features, but the model takes ", mc.input,
                                        " (model.input; the input has no label column)"));
  data::standardize(in.features, m.standardization);

  const size_t C = size_t(mc.classes), D = size_t(in.cols), bs = size_t(m.config.eval.batch_size);
  std::string text = "class";
  for (size_t k = 0; k < C; ++k) text += ",p" + std::to_string(k);
  text += "\n";
  NoGradGuard no_grad;
  char cell[32];
  for (size_t begin = 0; begin < size_t(in.rows); begin += bs) {
    const size_t n = std::min(size_t(in.rows) - begin, bs);
    const std::vector<float> rows(in.features.begin() + long(begin * D),
                                  in.features.begin() + long((begin + n) * D));
    const std::vector<double> l =
        forward(m, from_vector(rows, {int64_t(n), int64_t(D)}).to(m.device)).to_vector();
    for (size_t r = 0; r < n; ++r) {
      const double* row = &l[r * C];
      if (!std::all_of(row, row + C, [](double v) { return std::isfinite(v); }))
        throw train::NonFiniteError(detail::concat(input, ": data row ", begin + r + 1, " gives non-finite "
                                            "logits (an input too large for the model?); nothing written"));
      const size_t best = argmax(row, C);
      // Softmax, shifted by the largest logit so that exp never overflows.
      double sum = 0;
      for (size_t k = 0; k < C; ++k) sum += std::exp(row[k] - row[best]);
      text += std::to_string(best);
      for (size_t k = 0; k < C; ++k) {
        std::snprintf(cell, sizeof cell, ",%.9g", std::exp(row[k] - row[best]) / sum);
        text += cell;
      }
      text += "\n";
    }
  }
  write_file_atomically(output, text);
  return in.rows;
}

}  // namespace mt::app
