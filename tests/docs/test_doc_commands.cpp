// Every distmuon command line shown in README.md and docs/*.md (doc_commands.h) against the tool:
//  - a command line of a code block runs, and must succeed: at a size that takes seconds
//    (fast_command), the lines of one block in order in one fresh folder (a later line may read
//    what an earlier one wrote: --checkpoint then --resume); a block marked
//    `<!-- doc-commands: skip=REASON -->` is counted, not run (GPU-only lines);
//  - a synopsis (NAME, [--opt], A|B) and a command quoted inline in prose are checked against
//    `distmuon SUBCOMMAND --help`: the subcommand exists and so does every option it names.
// A doc that shows an option the tool does not have, or a command that fails, fails this test.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "doc_blocks.h"
#include "doc_commands.h"

namespace distmuon::test {
namespace {

namespace fs = std::filesystem;

TEST(DocCommands, FindsCommandLinesSpansAndSkippedBlocks) {
  const auto lines = split_lines(
      "Run `distmuon plan --shape 8x8` or `ls`.\n"
      "```\n"
      "mpirun -np 2 build/bin/distmuon train --steps 50 \\\n"
      "    --log run.jsonl   # a comment\n"
      "distmuon train: 2 ranks (mpi)\n"
      "```\n"
      "\n"
      "    distmuon plan --list-models\n"
      "\n"
      "<!-- doc-commands: skip=needs a CUDA GPU -->\n"
      "```\n"
      "DISTMUON_CUDA_PRECISION=tf32 distmuon demo --device cuda\n"
      "```\n");
  const auto c = find_doc_commands(lines);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_TRUE(c[0].inline_span);
  EXPECT_EQ(c[0].text, "distmuon plan --shape 8x8");
  EXPECT_EQ(c[1].text, "mpirun -np 2 build/bin/distmuon train --steps 50 --log run.jsonl");
  EXPECT_EQ(c[1].line, 3u);
  EXPECT_EQ(c[1].block, 1u);
  EXPECT_EQ(c[2].text, "distmuon plan --list-models");
  EXPECT_EQ(c[2].block, 2u);
  EXPECT_EQ(c[2].skip, "");
  EXPECT_EQ(c[3].skip, "needs a CUDA GPU");
  EXPECT_EQ(c[3].block, 3u);
}

TEST(DocCommands, SynopsesOptionsAndFastForms) {
  EXPECT_TRUE(is_synopsis("distmuon orthogonalize IN.npy OUT.npy [--steps N]"));
  EXPECT_TRUE(is_synopsis("mpirun -np G distmuon bench --model NAME|FILE"));
  EXPECT_TRUE(is_synopsis("distmuon calibrate --out FILE.json"));
  EXPECT_FALSE(is_synopsis("distmuon plan --model llama3-70b -G 8 --profile gb200"));
  EXPECT_FALSE(is_synopsis("DISTMUON_CUDA_PRECISION=tf32 distmuon demo"));
  EXPECT_EQ(subcommand_of("mpirun -np 2 distmuon --log-level warn train --steps 5"), "train");
  EXPECT_EQ(subcommand_of("distmuon --version"), "");
  EXPECT_EQ(options_of("distmuon orthogonalize IN OUT [--syrk|--no-syrk] [-G 8] > x"),
            (std::vector<std::string>{"--syrk", "--no-syrk", "-G"}));
  EXPECT_EQ(
      fast_command("mpirun -np 2 build/bin/distmuon train --steps 25 --log r.jsonl", "t.json"),
      "mpirun -np 2 build/bin/distmuon train --steps 3 --log r.jsonl --config t.json");
  EXPECT_EQ(fast_command("distmuon calibrate --out /tmp/c.json > log", "t"),
            "distmuon calibrate --out c.json --sizes 32,64 --max-bytes 4096 --reps 1 "
            "--comm-reps 2 > log");
}

// bash -c command in dir; the status and the output (stdout and stderr).
std::pair<int, std::string> run_in(const fs::path& dir, const std::string& command) {
  std::ofstream(dir / "command.sh") << "export PATH='" << DISTMUON_CLI_DIR << "':\"$PATH\"\n"
                                    << "export OMPI_MCA_rmaps_base_oversubscribe=1\n"
                                    << command << "\n";
  const std::string cmd = fmt::format(
      "cd '{}' && timeout -k 5 120 bash -o pipefail command.sh > out.txt 2>&1", dir.string());
  const int status = std::system(cmd.c_str());
  const int rc = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return {rc, read_text(dir / "out.txt")};
}

// Whether help (a subcommand's --help) lists option as a name of its own.
bool help_lists(const std::string& help, const std::string& option) {
  const std::regex name("(^|[\\s,])" + std::regex_replace(option, std::regex("-"), "\\-") +
                        "([\\s,={]|$)");
  return std::regex_search(help, name);
}

TEST(DocCommands, EveryCommandLineInTheDocsRuns) {
  const fs::path root(DISTMUON_SOURCE_DIR);
  const bool have_mpi = !std::string(DISTMUON_MPIEXEC).empty();
  std::vector<fs::path> docs{root / "README.md"};
  for (const auto& e : fs::directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") docs.push_back(e.path());
  std::sort(docs.begin(), docs.end());
  const fs::path work =
      fs::temp_directory_path() / fmt::format("distmuon_doc_commands_{}", ::getpid());
  fs::remove_all(work);
  fs::create_directories(work / "bin");
  fs::create_directories(work / "fixtures");
  // The tiny model every train run uses (docs show runs of the default one, minutes long).
  std::string text;
  while (text.size() < 6000)
    text += "free software for all, copies of the licence\n";
  std::ofstream(work / "fixtures" / "text.txt") << text;
  const fs::path tiny = work / "fixtures" / "tiny.json";
  std::ofstream(tiny) << fmt::format(
      R"({{"model": {{"context": 8, "embed": 8, "hidden": 16, "ffn": 64, "layers": 1}},
"data": {{"path": "{}"}},
"train": {{"batch": 8, "log_every": 1, "eval_every": 2, "eval_windows": 16}}}})",
      (work / "fixtures" / "text.txt").string());

  std::map<std::string, std::string> helps;  // subcommand -> its --help
  const auto help_of = [&](const std::string& sub) -> const std::string& {
    if (!helps.contains(sub)) helps[sub] = run_in(work, "distmuon " + sub + " --help").second;
    return helps[sub];
  };
  int ran = 0, checked = 0, skipped = 0, no_mpi = 0;
  for (const auto& doc : docs) {
    const std::string rel = fs::relative(doc, root).string();
    const auto commands = find_doc_commands(split_lines(read_text(doc)));
    std::size_t folder_block = 0;
    fs::path folder;
    for (const auto& c : commands) {
      const std::string where = fmt::format("{}:{}: `{}`", rel, c.line, c.text);
      if (!c.skip.empty()) {
        ++skipped;
        continue;
      }
      const std::string sub = subcommand_of(c.text);
      if (c.inline_span || is_synopsis(c.text)) {
        // The subcommand and every option exist.
        const std::string& help = help_of(sub);
        EXPECT_NE(help.find("Usage:"), std::string::npos)
            << where << ": no subcommand '" << sub << "':\n"
            << help;
        for (const auto& opt : options_of(c.text))
          EXPECT_TRUE(help_lists(help, opt) || help_lists(help_of(""), opt))
              << where << ": distmuon " << sub << " has no option " << opt;
        ++checked;
        continue;
      }
      if (c.text.find("--device cuda") != std::string::npos) {
        ADD_FAILURE() << where << " needs a GPU: mark its block <!-- doc-commands: skip=REASON -->";
        continue;
      }
      if (!have_mpi && c.text.find("mpirun") != std::string::npos) {
        ++no_mpi;
        continue;
      }
      if (c.block != folder_block) {  // one fresh folder per block
        folder_block = c.block;
        folder = work / fmt::format("{}_{}", fs::path(rel).stem().string(), c.block);
        fs::create_directories(folder / "build");
        fs::create_symlink(DISTMUON_CLI_DIR, folder / "build" / "bin");
        // The docs' commands run from the checkout's root: its model files are there too.
        fs::create_directories(folder / "bench");
        fs::create_symlink(root / "bench" / "models", folder / "bench" / "models");
      }
      const std::string fast = fast_command(c.text, tiny.string());
      const auto [rc, out] = run_in(folder, fast);
      EXPECT_EQ(rc, 0) << where << " failed (run as `" << fast << "`):\n" << out;
      if (std::getenv("DISTMUON_DOC_COMMANDS_VERBOSE") != nullptr)
        std::cout << where << "\n  ran `" << fast << "`: exit " << rc << "\n" << out;
      ++ran;
    }
  }
  std::cout << fmt::format(
      "doc command lines: {} ran, {} synopses and inline commands checked against --help, {} "
      "skipped (marked, e.g. GPU-only), {} not run (no MPI in this build)\n",
      ran, checked, skipped, no_mpi);
  EXPECT_GT(ran, 0);
  EXPECT_GT(checked, 0);
  fs::remove_all(work);
}

}  // namespace
}  // namespace distmuon::test
