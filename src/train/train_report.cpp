// The console report of a training run, the decision table, run comparisons and loss plots.
#include "distmuon/train_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>

#include "distmuon/blas_info.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "plot/gnuplot.h"

namespace distmuon {
namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double rel_diff(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

std::string count_str(double n) {
  if (n >= 1e6) return fmt::format("{:.1f} M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.0f} k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

}  // namespace

ConsoleReport::ConsoleReport(std::FILE* out, double progress_seconds, std::string label)
    : out_(out),
      progress_(out, progress_seconds > 0, progress_seconds),
      prefix_(label.empty() ? std::string() : "[" + label + "] ") {}

void ConsoleReport::print(const std::string& text) {
  progress_.clear();
  fmt::print(out_, "{}{}\n", prefix_, text);
  std::fflush(out_);
}

void ConsoleReport::on_start(const Trainer& trainer, int first_step) {
  const TrainConfig& c = trainer.config();
  const MuonOptions& o = trainer.optimizer().options();
  steps_ = c.train.steps;
  log_every_ = c.train.log_every;
  batch_ = c.train.batch;
  group_size_ = trainer.world().size();
  started_ = std::chrono::steady_clock::now();
  double muon_params = 0, adamw_params = 0;
  for (const CharLmParamInfo& p : charlm_param_infos(c.model))
    (p.kind == ParamKind::kMuon ? muon_params : adamw_params) += double(p.rows) * double(p.cols);
  print(fmt::format("distmuon train: {} rank{} ({}), seed {}, {} steps of {} windows ({} per rank)",
                    group_size_, group_size_ == 1 ? "" : "s", trainer.world().backend(),
                    c.train.seed, steps_, batch_, batch_ / group_size_));
  print(fmt::format(
      "model: context {}, embed {}, hidden {}, ffn {}, {} layers: {} parameters (Muon {}, {} {} "
      "rank{}; AdamW {})",
      c.model.context, c.model.embed, c.model.hidden, c.model.ffn, c.model.layers,
      count_str(muon_params + adamw_params), count_str(muon_params),
      c.train.replicated() ? "replicated on" : "rows sharded over", group_size_,
      group_size_ == 1 ? "" : "s", count_str(adamw_params)));
  print(fmt::format("blas: {}", blas_summary()));
  const TextData& d = trainer.data();
  print(fmt::format(
      "data: {} ({} bytes): {} training / {} validation windows; unigram entropy {:.4f} nats/byte",
      c.data.path, d.bytes().size(), d.windows(Split::kTrain), d.windows(Split::kValidation),
      trainer.unigram_entropy()));
  print(fmt::format(
      "optimizer ({}): Muon lr {}, momentum {}{}, weight decay {}, {} x {} NS steps ({}), "
      "tp_mode {} (cost model {}, profile {}{}); AdamW lr {} for the embedding and the head",
      c.train.device, o.lr, o.momentum, o.nesterov ? " (Nesterov)" : "", o.weight_decay,
      o.coefficients, o.steps, to_string(o.ns_algorithm), to_string(o.tp_mode), o.cost_model,
      o.profile,
      o.plan == PlanMode::kMeasure
          ? fmt::format(", plan measure{}", o.wisdom.empty() ? "" : ", wisdom " + o.wisdom)
          : "",
      o.adamw.lr));
  print(fmt::format("validation: every {} steps and at the last, on {} windows", c.train.eval_every,
                    std::min<Index>(c.train.eval_windows, d.windows(Split::kValidation))));
  if (first_step > 0) print(fmt::format("resumed at step {}", first_step));
}

void ConsoleReport::on_decisions(const std::vector<ShapeDecision>& decisions) {
  std::string table = format_decisions(decisions);
  while (!table.empty() && table.back() == '\n')
    table.pop_back();
  std::size_t begin = 0;
  while (begin <= table.size()) {
    const std::size_t end = std::min(table.find('\n', begin), table.size());
    print(table.substr(begin, end - begin));
    begin = end + 1;
  }
}

void ConsoleReport::on_step(const StepRecord& r) {
  ++interval_steps_;
  interval_step_ms_ += r.step_ms;
  interval_opt_ms_ += r.opt_ms;
  interval_comm_ms_ += r.opt_comm_ms;
  if (r.step % log_every_ == 0 || r.step == steps_ || r.val_loss) {
    const double n = interval_steps_;
    const double tokens_per_s = double(batch_) * n / (interval_step_ms_ * 1e-3);
    print(fmt::format(
        "step {:>{}}/{}  loss {:.4f}  {:<12}  {:>9.0f} tok/s  step {:6.1f} ms  opt {:6.1f} ms "
        "(NS {:.1f} + comm {:.1f})",
        r.step, fmt::formatted_size("{}", steps_), steps_, r.loss,
        r.val_loss ? fmt::format("val {:.4f}", *r.val_loss) : std::string(), tokens_per_s,
        interval_step_ms_ / n, interval_opt_ms_ / n, (interval_opt_ms_ - interval_comm_ms_) / n,
        interval_comm_ms_ / n));
    interval_steps_ = 0;
    interval_step_ms_ = interval_opt_ms_ = interval_comm_ms_ = 0;
  } else {  // a line on a terminal, or one every 30 s into a log
    progress_.update(fmt::format("{}... step {}/{} ({:.0f}%), {:.1f} s elapsed", prefix_, r.step,
                                 steps_, 100.0 * double(r.step) / steps_, since(started_)));
  }
}

void ConsoleReport::on_checkpoint(int step, const std::filesystem::path& dir) {
  print(fmt::format("checkpoint at step {} saved to {}", step, dir.string()));
}

void ConsoleReport::on_end(const TrainSummary& s) {
  if (s.records.empty()) {
    print(fmt::format("done: no step left to train (the run is at step {})", s.first_step));
  } else {
    print(fmt::format("done: steps {}-{} in {:.1f} s ({:.1f} s evaluating)", s.first_step + 1,
                      s.records.back().step, s.seconds, s.eval_seconds));
  }
  print(fmt::format(
      "final validation loss {:.4f} nats/byte vs unigram entropy {:.4f} ({:+.4f}, {:.0f}% of it)",
      s.final_val_loss, s.unigram_entropy, s.final_val_loss - s.unigram_entropy,
      100.0 * s.final_val_loss / s.unigram_entropy));
}

std::string compact_names(const std::vector<std::string>& names) {
  static const std::regex index_part(R"(\.[0-9]+\.)");
  struct Group {
    std::string pattern, first;
    int count = 0;
  };
  std::vector<Group> groups;  // in order of appearance
  for (const std::string& name : names) {
    const std::string pattern = std::regex_replace(name, index_part, ".*.");
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const Group& g) { return g.pattern == pattern; });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{pattern, name, 0});
    ++it->count;
  }
  std::vector<std::string> parts;
  for (const Group& g : groups)
    parts.push_back(g.count == 1 ? g.first : fmt::format("{} ({})", g.pattern, g.count));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string format_decisions(const std::vector<ShapeDecision>& decisions) {
  if (decisions.empty()) return "no Muon weights\n";
  const ShapeDecision& first = decisions.front();
  std::string out;
  if (first.replicas > 1) {
    out += fmt::format(
        "Muon weights by shape: replicated on {} ranks (data parallel): NS once on a home rank per "
        "weight, or on every rank; cost model estimates of one NS{}\n",
        first.replicas, first.in_seconds ? "" : " (FLOPs: no hardware profile)");
  } else if (first.key.group_size > 1) {
    out += fmt::format(
        "Muon weights by shape: rows sharded over {} ranks; cost model estimates per weight{}\n",
        first.key.group_size, first.in_seconds ? "" : " (FLOPs per rank: no hardware profile)");
  } else {
    out += "Muon weights by shape: one rank, nothing sharded: plain Newton-Schulz\n";
  }
  std::size_t width = 7;
  for (const ShapeDecision& d : decisions)
    width = std::max(width, compact_names(d.names).size());
  // The Gram and owner columns when the model priced them (owner: the NS on the owner alone).
  const bool gram = first.estimate.prices_gram;
  out += fmt::format("  {:<11} {:<{}}  {:<17}  {:>12}  {:>12}", "shape", "weights", width, "mode",
                     "duplicated", "distributed");
  out +=
      gram ? fmt::format("  {:>12}  {:>12}  {:>12}\n", "dup+gram", "dist+gram", "owner NS") : "\n";
  for (const ShapeDecision& d : decisions) {
    const std::string mode = d.sharded         ? to_string(AutoChoice{d.mode, d.algorithm})
                             : d.replicas == 1 ? "unsharded"
                             : d.home          ? fmt::format("home of {}", d.replicas)
                                               : "every rank";
    const auto cost = [&](TpMode m, NsAlgorithm a) {
      return format_cost(d.estimate.cost(m, a), d.in_seconds);
    };
    out += fmt::format("  {:<11} {:<{}}  {:<17}  {:>12}  {:>12}", fmt::format("{}x{}", d.m, d.n),
                       compact_names(d.names), width, mode,
                       cost(TpMode::kDuplicated, NsAlgorithm::kStandard),
                       cost(TpMode::kDistributed, NsAlgorithm::kStandard));
    if (gram) {
      const NsAlgorithm own = d.estimate.cost(TpMode::kOwner, NsAlgorithm::kGram) <
                                      d.estimate.cost(TpMode::kOwner, NsAlgorithm::kStandard)
                                  ? NsAlgorithm::kGram
                                  : NsAlgorithm::kStandard;
      out += fmt::format("  {:>12}  {:>12}  {:>12}", cost(TpMode::kDuplicated, NsAlgorithm::kGram),
                         cost(TpMode::kDistributed, NsAlgorithm::kGram), cost(TpMode::kOwner, own));
    }
    out += "\n";
  }
  return out;
}

std::string format_comparison(const TrainSummary& a, const std::string& a_label,
                              const TrainSummary& b, const std::string& b_label) {
  std::map<int, const StepRecord*> by_step;
  for (const StepRecord& r : b.records)
    by_step[r.step] = &r;
  double worst = 0, worst_val = 0;
  int worst_step = 0, compared = 0, compared_val = 0;
  double a_step = 0, a_opt = 0, a_comm = 0, b_step = 0, b_opt = 0, b_comm = 0;
  for (const StepRecord& r : a.records) {
    const auto it = by_step.find(r.step);
    if (it == by_step.end()) continue;
    const StepRecord& q = *it->second;
    ++compared;
    const double d = rel_diff(r.loss, q.loss);
    if (compared == 1 || d > worst) {
      worst = d;
      worst_step = r.step;
    }
    if (r.val_loss && q.val_loss) {
      ++compared_val;
      worst_val = std::max(worst_val, rel_diff(*r.val_loss, *q.val_loss));
    }
    a_step += r.step_ms, a_opt += r.opt_ms, a_comm += r.opt_comm_ms;
    b_step += q.step_ms, b_opt += q.opt_ms, b_comm += q.opt_comm_ms;
  }
  if (compared == 0) return "comparison: the runs have no step in common\n";
  const double n = compared;
  std::string out = fmt::format("comparison of {} steps: {} vs {}\n", compared, a_label, b_label);
  out += fmt::format("  training loss: largest relative difference {:.2e} (step {})\n", worst,
                     worst_step);
  if (compared_val > 0) {
    out +=
        fmt::format("  validation loss: largest relative difference {:.2e} over {} evaluations\n",
                    worst_val, compared_val);
  }
  out += fmt::format(
      "  mean step {:.1f} ms vs {:.1f} ms; optimizer {:.1f} ms (comm {:.1f}) vs "
      "{:.1f} ms (comm {:.1f})\n",
      a_step / n, b_step / n, a_opt / n, a_comm / n, b_opt / n, b_comm / n);
  return out;
}

LossCurve loss_curve(const TrainSummary& summary, std::string label) {
  LossCurve c;
  c.label = std::move(label);
  for (const StepRecord& r : summary.records) {
    c.train.emplace_back(r.step, r.loss);
    if (r.val_loss) c.val.emplace_back(r.step, *r.val_loss);
  }
  return c;
}

void check_plot_possible(const std::filesystem::path& png) {
  check_output_file(png, "--plot");
  const std::filesystem::path folder =
      png.has_parent_path() ? png.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::is_directory(folder)) {
    throw Error(
        fmt::format("--plot {}: the folder {} does not exist", png.string(), folder.string()));
  }
  detail::GnuplotJob job("--plot");  // throws when gnuplot is missing
}

void render_loss_plot(const std::vector<LossCurve>& curves, double unigram_entropy,
                      const std::string& title, const std::filesystem::path& png) {
  detail::GnuplotJob job("train --plot");
  static const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
  std::vector<std::string> series;
  for (std::size_t i = 0; i < curves.size(); ++i) {
    const LossCurve& c = curves[i];
    const char* color = kColors[i % std::size(kColors)];
    std::string train, val;
    for (const auto& [step, loss] : c.train)
      train += fmt::format("{} {}\n", step, loss);
    for (const auto& [step, loss] : c.val)
      val += fmt::format("{} {}\n", step, loss);
    const std::string train_file =
        job.data(fmt::format("train{}.dat", i), train.empty() ? "NaN NaN\n" : train);
    const std::string val_file =
        job.data(fmt::format("val{}.dat", i), val.empty() ? "NaN NaN\n" : val);
    series.push_back(fmt::format("{} using 1:2 with lines lw {} lc rgb \"{}\" title {}", train_file,
                                 i == 0 ? 3.0 : 1.5, color,
                                 detail::gnuplot_quoted(c.label + " training")));
    series.push_back(
        fmt::format("{} using 1:2 with linespoints pt 7 ps 1.2 dt 2 lc rgb \"{}\" title {}",
                    val_file, color, detail::gnuplot_quoted(c.label + " validation")));
  }
  series.push_back(
      fmt::format("{} with lines dt 3 lc rgb \"gray40\" title {}", unigram_entropy,
                  detail::gnuplot_quoted(fmt::format("unigram entropy {:.3f}", unigram_entropy))));
  const std::string script = fmt::format(
      R"gp({terminal}
set output {png}
set title {title} noenhanced
set xlabel "step"
set ylabel "loss (nats per byte)"
set grid
set key top right noenhanced
plot {series}
)gp",
      fmt::arg("terminal", detail::gnuplot_png_terminal(960, 600)), fmt::arg("png", job.output()),
      fmt::arg("title", detail::gnuplot_quoted(title)),
      fmt::arg("series", fmt::join(series, ", \\\n     ")));
  job.run(script, png);
}

}  // namespace distmuon
