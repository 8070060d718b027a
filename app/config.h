#pragma once
// The trainer's configuration: a YAML file (configs/mlp.yaml), then `--set key.path=value`
// overrides, validated as a whole before anything runs. Every key is optional; the defaults below
// are a small synthetic run that needs no download. docs/config.md has the table.
//
// A bad config is a ConfigError naming the full key path and where the value came from, e.g.
//   optim.lr: expected a number, got 'fast' at mlp.yaml:7:7
//   optim.lrr: unknown key (from --set optim.lrr=1); did you mean 'optim.lr'?
//
// What follows from the values alone is checked here too: every size has an upper bound (below),
// the generated data must hold enough samples for the batch and the held-out splits, strings are
// valid UTF-8 on one source line, and the file is one YAML document of at most kMaxConfigBytes.
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "data/data.h"
#include "train/options.h"
#include "train/rules.h"

namespace mt {

// Upper bounds of the size keys. Far above any model this trainer is for, and low enough that
// every product formed from them (samples x input, input x width, batch x width) fits in 64 bits
// with room to spare; whether a model of that size fits in memory is the trainer's check.
inline constexpr int64_t kMaxWidth = int64_t(1) << 24;   // model.input, .hidden[i], .classes
inline constexpr size_t kMaxLayers = 1024;               // entries of model.hidden
inline constexpr int64_t kMaxSamples = train::kMaxSamples;  // data.samples, optim/eval.batch_size
// A config file: 1 MiB. YAML parsing takes some 190 bytes a byte of text (1M one-letter keys in
// 10 MB peaked at 1.87 GB); a real config is a few KiB.
inline constexpr size_t kMaxConfigBytes = size_t(1) << 20;

// A model or data kind's own keys (app/registry.h: each kind declares its keys, their types,
// defaults and checks): each value as YAML text, in the kind's order, read with the accessors.
enum class ParamType { integer, number, boolean, string, integers };
struct Params {
  std::vector<std::pair<std::string, std::string>> values;
  const std::string& text(const std::string& key) const;  // an Error for a key not there
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  bool boolean(const std::string& key) const;
  std::string string(const std::string& key) const;
  std::vector<int64_t> integers(const std::string& key) const;
  bool operator==(const Params&) const = default;
};

// The model the `train` program builds: model.kind names a registered kind (app/registry.h),
// which reads the keys below and its own (params). The MLP's keys are the schema's; input and
// classes also shape the synthetic data, so a program with a model of its own sets them for it.
struct ModelConfig {
  std::string kind = "mlp";                // a registered model kind
  int64_t input = 32;                        // features per sample
  std::vector<int64_t> hidden = {128, 128};  // hidden layer widths; empty = a linear model
  int64_t classes = 8;
  std::string norm = "rms_norm";           // rms_norm | none
  std::string activation = "scaled_silu";  // scaled_silu | relu
  bool bias = true;
  Params params;  // the kind's own keys
  bool operator==(const ModelConfig&) const = default;
};

struct DataConfig {
  std::string kind = "synthetic";  // a registered data kind: synthetic | mnist | csv | ...
  int64_t samples = 20000;         // synthetic only
  double noise = 0.1;              // synthetic only
  std::string path;                // mnist / csv: the training data; text, tokens: the file
  std::string test_path;           // optional held-out test data
  double test_fraction = 0;        // file data without test_path: share of `path` held out as the test set
  int64_t label_column = -1;       // csv: -1 = last
  std::string header = "auto";     // csv: auto (per file: a first line that is not all numbers) | true | false
  bool standardize = false;        // features to mean 0, std 1 by the training split's statistics
  double val_fraction = 0.1;       // share of the training data held out for validation
  bool shuffle = true;
  uint64_t seed = 1;  // shuffling and the synthetic data
  Params params;      // the kind's own keys
  bool operator==(const DataConfig&) const = default;
};

// The synthetic test set: an independent draw of a fifth as many samples as the training set.
inline int64_t synthetic_test_samples(int64_t samples) { return samples / 5; }

struct OptimConfig {
  std::string name = "adamw";  // adamw | sgd
  double lr = 0.003;
  double weight_decay = 0.01;
  std::array<double, 2> betas = {0.9, 0.999};  // adamw
  double eps = 1e-8;                           // adamw
  double momentum = 0.9;                       // sgd
  bool nesterov = false;                       // sgd
  bool shard_state = false;  // adamw, data parallel: ZeRO-1, the state sharded over the ranks (train/zero.h)
  std::string schedule = "cosine";             // constant | cosine
  int64_t warmup_steps = 20;
  double min_lr = 0.0;  // where the cosine ends
  int64_t steps = 300;  // optimizer steps
  int64_t epochs = 0;   // > 0: train this many passes over the training split instead of `steps`
  int64_t batch_size = 256;
  int64_t microbatches = 4;  // the batch is split into this many backward passes
  double clip_norm = 1.0;    // max global gradient norm; 0 = no clipping
  bool operator==(const OptimConfig&) const = default;
};

struct PrecisionConfig {
  DType compute_dtype = DType::f32;    // f64 | f32 | bf16 | f16
  bool deterministic = true;           // deterministic reductions
  bool gemm_autotune = false;          // CUDA GEMM algorithms chosen by timing (core/switches.h)
  std::string loss_scale = "dynamic";  // dynamic | none | fixed (YAML: a positive number)
  double fixed_loss_scale = 0.0;       // the scale when loss_scale == "fixed"
  double initial_scale = 65536.0;      // dynamic: where the scale starts (2^16)
  int64_t growth_interval = 200;       // dynamic: steps without overflow before the scale doubles
  bool operator==(const PrecisionConfig&) const = default;
};

struct EvalConfig {
  int64_t every = 100;  // optimizer steps between evaluations
  int64_t batch_size = 1024;
  bool operator==(const EvalConfig&) const = default;
};

struct CheckpointConfig {
  std::string dir = "runs/mlp";
  int64_t every = 100;
  int64_t keep_last = 2;
  bool keep_best = false;  // also <dir>/best.safetensors, the lowest validation loss's step
  bool overwrite = false;  // a fresh run may delete another run's files in dir (train/run_dir.h)
  bool operator==(const CheckpointConfig&) const = default;
};

struct LoggingConfig {
  int64_t every = 25;
  std::string metrics;  // empty = <checkpoint.dir>/metrics.jsonl; see train::metrics_path()
  std::string curve;    // empty = <checkpoint.dir>/curve.svg; see train::curve_path()
  bool operator==(const LoggingConfig&) const = default;
};

struct Config {
  uint64_t seed = 0;
  std::string device = "auto";  // auto | cpu | cuda | cuda:N
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  PrecisionConfig precision;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  bool cuda_graph = false;
  bool operator==(const Config&) const = default;
};

// Reads `path` (an empty path: no file, only the defaults; a file of more than kMaxConfigBytes,
// or a device or pipe that gives more, is refused unread), applies each override
// "key.path=value" (the value parsed as YAML, so `optim.lr=1e-3` and `model.hidden=[64,64]` work)
// in order, then validates. Throws ConfigError.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The same from YAML text; `name` stands for the file in messages (a config saved in a checkpoint).
Config parse_config(const std::string& yaml, const std::string& name,
                    const std::vector<std::string>& overrides = {});

// A complete YAML document for `c`, every key written out: parse_config(to_yaml(c)) == c.
std::string to_yaml(const Config& c);

// The reference of every key (docs/config.md's table, `train --config-reference`): key, type,
// default, meaning and constraints, from the same schema that parses and prints, with the keys of
// every documented model and data kind.
std::string reference_table();

// Shortest text that reads back as exactly `v` (how to_yaml writes numbers).
std::string format_number(double v);

// Whether `spec` names a device: auto, cpu, cuda or cuda:N.
bool valid_device(const std::string& spec);

}  // namespace mt

namespace mt::app {

// The trainer's options the config's sections give (optim, precision, eval, checkpoint, logging,
// cuda_graph), field by field; the job keys and the checkpoint's metadata are ConfigTrainer's
// (app/config_trainer.h). The config checks its values by train::validate's rules
// (train/rules.h) on these options, as it reads them.
train::Options options_from(const Config& c);

}  // namespace mt::app

namespace mt::data {

// The data a config's `data` section names: the training set, or with `test` the test set
// (the synthetic task's is an independent draw from the same clusters; for files, data.test_path
// or data.test_fraction).
// Whatever a loader applies (MNIST's normalization, say) is applied the same for every caller:
// training, `train eval` and `train predict` see the same features. A file that cannot be read
// or parsed, or that holds no samples, is a DataError. data.header "auto" is decided for each
// file on its own.
Dataset load_dataset(const DataConfig& d, const ModelConfig& m, bool test);
// With data.test_fraction, the test set is a seeded draw (data.seed) of that share of data.path's
// rows, kept in file order, and the training set is the other rows.
// Whether there is a test set: always for the synthetic task, for files with data.test_path or
// data.test_fraction.
bool has_test_set(const DataConfig& d);

}  // namespace mt::data
