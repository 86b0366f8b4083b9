#pragma once
// Drawing PNGs with gnuplot (Debian's package): a temporary folder holds the data files and the
// script, gnuplot runs on them without a shell, and its exit status and output are checked. Used
// by `plan --map` (decision_map.cpp), `bench --plot` (model_bench_plot.cpp) and `train --plot`
// (train_report.cpp).

#include <filesystem>
#include <string>

namespace distmuon::detail {

// A gnuplot single-quoted string ('' is a quote inside).
std::string gnuplot_quoted(const std::string& s);

// The first line of a script: the pngcairo terminal when gnuplot has it, else png, at the size
// in pixels.
std::string gnuplot_png_terminal(int width, int height);

class GnuplotJob {
 public:
  // what names the caller in errors ("plan --map"). Finds gnuplot on PATH and creates the
  // temporary folder; throws distmuon::Error when gnuplot is missing or the folder cannot be
  // made.
  explicit GnuplotJob(std::string what);
  ~GnuplotJob();
  GnuplotJob(const GnuplotJob&) = delete;
  GnuplotJob& operator=(const GnuplotJob&) = delete;

  // Writes a data file into the folder; returns its path, quoted for the script.
  std::string data(const std::string& name, const std::string& text);
  // Where the script sets its output, quoted for the script: a file in the job's folder. gnuplot
  // writes there, and run() moves it into place only once gnuplot succeeded, so a gnuplot that
  // fails halfway never leaves a truncated PNG under the user's name.
  std::string output() const;
  // Runs gnuplot on the script (whose output is output()), checks that it wrote a non-empty
  // PNG, and writes it to png atomically (write_file_atomic). On failure the folder is kept
  // (named in the error, with gnuplot's messages) and png is left as it was; on success the
  // folder is removed.
  void run(const std::string& script, const std::filesystem::path& png);

 private:
  std::string what_;
  std::filesystem::path gnuplot_, dir_;
  bool keep_ = false;
};

}  // namespace distmuon::detail
