#pragma once
// The run folder (checkpoint.dir) belongs to one run at a time.
//
// While a run trains, it holds an exclusive flock(2) on <dir>/.lock (which records its pid): a
// second run on the same folder, in another process or in this one, is refused instead of
// deleting the first one's temp files, pairing its model files with the other's optimizer files
// or truncating its metrics. The kernel releases the lock when the run ends, however it ends.
//
// And a run does not mix its files with another run's: a fresh run refuses a folder that already
// holds checkpoints or a metrics file, and a resumed one a folder holding checkpoints of another
// run id, unless checkpoint.overwrite is set, which deletes those first.
//
// A run resumed from an older checkpoint than its newest in the folder is a branch: its
// checkpoints would be pruned against the other branch's, and the next `--resume DIR` would take
// the other branch's newest. It is refused, naming the later checkpoints, unless
// checkpoint.overwrite is set, which deletes them first (the branch then is the run).
#include <string>
#include <vector>

namespace mt::train {

class RunDir {
 public:
  // Creates `dir` if needed and locks it; a ConfigError (exit code 2) naming the folder and the
  // holder's pid if another run holds it.
  explicit RunDir(const std::string& dir);
  ~RunDir();  // releases the lock
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  // Makes sure the folder holds nothing of another run before run `run_id` writes there: for a
  // fresh run (`resumed_step` < 0), no checkpoints (best.safetensors included) and no non-empty
  // `metrics` file; for one resumed at `resumed_step`, no checkpoints of another run id and none
  // of its own past that step (unless `newer_skipped`: the resume searched this folder and passed
  // over the newer ones as damaged or unfit). Otherwise a ConfigError that names the folder, what is in it and the
  // choices; or, with `overwrite`, those files are deleted. The later checkpoints a resume passed
  // over, and damaged ones past its step, are moved aside as step-N.skipped.safetensors (and
  // .skipped.optim.safetensors): the run's own save at that step would replace them.
  // The curve too: a fresh run refuses an existing non-empty `curve`, a resumed one a curve that
  // another run drew.
  void claim(const std::string& run_id, int64_t resumed_step, bool newer_skipped,
             const std::string& metrics, const std::string& curve, bool overwrite);

  // A file the run writes outside the folder (logging.metrics, logging.curve; `key` names it) is
  // locked as the folder is, through `<path>.lock`, so that two runs never write one file. A
  // pipe or a device is a stream: not locked. A path inside the folder needs no lock of its own.
  void lock_file(const std::string& key, const std::string& path);

 private:
  std::string dir_;
  std::vector<int> fds_;  // the locks held
};

}  // namespace mt::train
