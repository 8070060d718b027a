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
#include <string>

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
  // fresh run (`fresh`), no checkpoints (best.safetensors included) and no non-empty `metrics`
  // file; for a resumed one, no checkpoints of another run id. Otherwise a ConfigError that names the folder, what is in it
  // and the choices; or, with `overwrite`, those files are deleted.
  void claim(const std::string& run_id, bool fresh, const std::string& metrics, bool overwrite);

 private:
  std::string dir_;
  int fd_ = -1;
};

}  // namespace mt::train
