#pragma once
// Drawing PNGs with gnuplot (internal): a script and its data files in a temporary folder, gnuplot
// run without a shell, its exit status and output file checked. Used by `plan --map` and
// `bench --plot`.

#include <filesystem>
#include <string>

namespace distmuon::detail {

class GnuplotJob {
 public:
  // Finds gnuplot on PATH and makes a temporary folder. `what` names the caller in errors
  // ("plan --map"). Throws distmuon::Error when gnuplot is missing or the folder cannot be made.
  explicit GnuplotJob(std::string what);
  ~GnuplotJob();  // removes the folder unless a failed run kept it for inspection
  GnuplotJob(const GnuplotJob&) = delete;
  GnuplotJob& operator=(const GnuplotJob&) = delete;

  // Writes a data file into the folder; returns its path.
  std::filesystem::path add_file(const std::string& name, const std::string& text);
  // Runs the script; throws with gnuplot's messages (keeping the folder) when it fails or does
  // not write a non-empty png.
  void run(const std::string& script, const std::filesystem::path& png);

 private:
  std::string what_;
  std::filesystem::path gnuplot_, dir_;
  bool keep_ = false;
};

// A gnuplot single-quoted string ('' is a quote inside).
std::string gnuplot_quoted(const std::string& s);
// The first line of a script that sets a PNG terminal of the given size (pngcairo when present).
std::string gnuplot_png_terminal(int width, int height);

}  // namespace distmuon::detail
