// `distmuon train`: the character-level model trained data-parallel with Muon on row-sharded
// weights (include/distmuon/trainer.h). See docs/training.md.
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "commands.h"
#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/memory_check.h"
#include "distmuon/train_report.h"
#include "distmuon/trainer.h"

namespace distmuon::cli {

void add_train_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "train", "Train the character-level model with Muon on weights sharded over the ranks");
  struct Opts {
    std::string config, data, tp_mode, profile, cost_model, plan, wisdom, log, checkpoint, resume,
        plot, compare, ns_algorithm, precision, weights, replica_mode, replica_wire;
    std::uint64_t seed = 0;
    int steps = 0, log_interval = 0, eval_interval = 0, checkpoint_every = 0;
    double progress = 1.0;
    bool overwrite_checkpoints = false;
    DeviceCliOption device;
  };
  auto o = std::make_shared<Opts>();
  const std::string modes = "blockwise|duplicated|distributed|owner|auto";
  cmd->add_option("--config", o->config,
                  "Training config JSON, merged over the embedded default (docs/training.md)")
      ->check(non_empty_path());
  cmd->add_option("--data", o->data, "Text file to train on (default: the config's data.path)")
      ->check(non_empty_path());
  auto* seed = cmd->add_option("--seed", o->seed, "Seed of weights, data split and batches")
                   ->check(at_least<std::uint64_t>(0));
  auto* steps = cmd->add_option("--steps", o->steps, "Training steps (not Newton-Schulz steps)")
                    ->check(at_least<int>(1));
  const std::vector<std::string> mode_names = names_of<TpMode>();
  cmd->add_option("--tp-mode", o->tp_mode, "How Newton-Schulz runs on the shards: " + modes)
      ->check(CLI::IsMember(mode_names));
  cmd->add_option("--weights", o->weights,
                  "How the ranks hold the Muon weights: sharded (rows over the ranks) or "
                  "replicated (data parallel: whole on every rank, gradients all-reduced)")
      ->check(CLI::IsMember({"sharded", "replicated"}));
  cmd->add_option("--replica-mode", o->replica_mode,
                  "Replicated weights: orthogonalised on one home rank each (home), by every rank "
                  "(every_rank), or as the cost model decides (auto)")
      ->check(CLI::IsMember({"auto", "home", "every_rank"}));
  cmd->add_option(
         "--replica-wire", o->replica_wire,
         "Replicated weights: how a home's result reaches the other replicas: fp32 (bit-equal "
         "to every rank's NS) or bf16 (half the bytes, each element rounded to bf16)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--ns-algorithm", o->ns_algorithm,
                  "Newton-Schulz algorithm (default: the config's, standard: every tp-mode gives "
                  "duplicated's result); auto: tp-mode auto picks standard or gram per weight, "
                  "faster within Gram NS's error (docs/training.md); gram")
      ->check(CLI::IsMember(names_of<NsAlgorithm>()));
  cmd->add_option("--precision", o->precision,
                  "Arithmetic of Newton-Schulz's products (default: the config's optimizer "
                  "precision, auto: the device's default, fp32 on cpu, bf16 on cuda): fp32, tf32, "
                  "bf16 (docs/precision.md)")
      ->check(CLI::IsMember(names_of<Precision>({"auto"})));
  cmd->add_option("--profile", o->profile,
                  "Hardware profile for tp-mode auto: none, a built-in name (distmuon profiles) or "
                  "a JSON file (distmuon calibrate)")
      ->check(non_empty_path());
  cmd->add_option("--cost-model", o->cost_model, "Cost model for tp-mode auto: refined|reference")
      ->check(CLI::IsMember(names_of<CostModel>()));
  cmd->add_option("--plan", o->plan,
                  "How tp-mode auto plans: estimate (the cost model) or measure (time the model's "
                  "leading candidates before the first step)")
      ->check(CLI::IsMember(names_of<PlanMode>()));
  cmd->add_option("--wisdom", o->wisdom,
                  "With --plan measure: read and write measured times in this JSON file")
      ->check(non_empty_path());
  auto* log_interval = cmd->add_option("--log-interval", o->log_interval, "Print every N steps")
                           ->check(at_least<int>(1));
  auto* eval_interval =
      cmd->add_option("--eval-interval", o->eval_interval, "Validation loss every N steps")
          ->check(at_least<int>(1));
  cmd->add_option("--log", o->log,
                  "Write one JSON object per step to this file (JSONL); a new run refuses an "
                  "existing log, --resume continues it")
      ->check(non_empty_path());
  auto* checkpoint = cmd->add_option("--checkpoint", o->checkpoint,
                                     "Save checkpoints (weights, optimizer state, step) here")
                         ->check(non_empty_path());
  cmd->add_option("--checkpoint-every", o->checkpoint_every,
                  "Save every N steps (and at the last step)")
      ->check(at_least<int>(1))
      ->needs(checkpoint);
  cmd->add_flag("--overwrite-checkpoints", o->overwrite_checkpoints,
                "Replace another run's checkpoints in the --checkpoint folder (refused without it)")
      ->needs(checkpoint);
  cmd->add_option("--resume", o->resume, "Resume from the checkpoint in this folder")
      ->check(non_empty_path());
  cmd->add_option("--plot", o->plot, "Draw the loss curves into this PNG (needs gnuplot)")
      ->check(non_empty_path());
  cmd->add_option(
         "--compare", o->compare,
         "Then train again with this tp-mode from the same start and compare (" + modes + ")")
      ->check(CLI::IsMember(mode_names));
  auto* device = o->device.add_to(*cmd)->default_str("");  // the config's by default
  device->description(device->get_description() +
                      "; the optimizer runs there, the model on the host (default: the config's "
                      "train.device)");
  cmd->add_option("--progress", o->progress,
                  "Without --log: a progress line between logged steps, on a terminal updated at "
                  "most every S seconds, else one line every 30 s (0: none)")
      ->check(number_in_range(0, 3600))
      ->capture_default_str();
  cmd->callback([o, &ctx, seed, steps, log_interval, eval_interval, device] {
    // Every rank checks the options; one message (from rank 0) when they fail.
    TrainConfig config;
    MuonOptions options;
    std::string failure;
    try {
      config = o->config.empty() ? default_train_config() : load_train_config(o->config);
      if (!o->data.empty()) config.data.path = o->data;
      if (seed->count() > 0) config.train.seed = o->seed;
      if (steps->count() > 0) config.train.steps = o->steps;
      if (log_interval->count() > 0) config.train.log_every = o->log_interval;
      if (eval_interval->count() > 0) config.train.eval_every = o->eval_interval;
      if (device->count() > 0) config.train.device = o->device.name;
      if (!o->weights.empty()) config.train.weights = o->weights;
      if (!o->tp_mode.empty()) config.optimizer["tp_mode"] = o->tp_mode;
      if (!o->replica_mode.empty()) config.optimizer["replica_mode"] = o->replica_mode;
      if (!o->replica_wire.empty()) config.optimizer["replica_wire"] = o->replica_wire;
      if (!o->ns_algorithm.empty()) config.optimizer["ns_algorithm"] = o->ns_algorithm;
      if (!o->precision.empty()) config.optimizer["precision"] = o->precision;
      if (!o->profile.empty()) config.optimizer["profile"] = o->profile;
      if (!o->cost_model.empty()) config.optimizer["cost_model"] = o->cost_model;
      if (!o->plan.empty()) config.optimizer["plan"] = o->plan;
      if (!o->wisdom.empty()) config.optimizer["wisdom"] = o->wisdom;
      options = optimizer_options(config);
      if (!o->compare.empty() && parse_tp_mode(o->compare) == options.tp_mode) {
        throw Error(fmt::format("--compare {}: the run itself already uses tp-mode {}", o->compare,
                                to_string(options.tp_mode)));
      }
      if (!o->plot.empty() && ctx.world.rank() == 0) check_plot_possible(o->plot);
      if (!o->log.empty() && ctx.world.rank() == 0) {
        check_output_file(o->log, "--log");
        // A new run would truncate the log of an earlier one: refused. --resume keeps the
        // earlier run's lines up to the resumed step and appends.
        std::error_code ec;
        const auto size = std::filesystem::file_size(o->log, ec);
        if (o->resume.empty() && !ec && size > 0) {
          throw Error(fmt::format(
              "--log {}: the file exists ({} bytes) and a new run would overwrite it; remove it, "
              "name another file, or --resume the run that wrote it",
              o->log, size));
        }
      }
      // Per rank (the memory each rank has may differ): agreed on below.
      check_memory_fits(train_memory_bytes(config, ctx.world.size()),
                        fmt::format("train with a global batch of {} windows over {} rank(s) "
                                    "(hidden {}, ffn {}, {} layers)",
                                    config.train.batch, ctx.world.size(), config.model.hidden,
                                    config.model.ffn, config.model.layers));
    } catch (const std::exception& e) {
      failure = e.what();
    }
    agree_or_throw(ctx.world, failure.empty(), "train: options", failure);
    DeviceCliOption{config.train.device}.resolve(ctx.world);  // refused alike on every rank

    TrainRunOptions run{.log_jsonl = o->log,
                        .checkpoint_dir = o->checkpoint,
                        .checkpoint_every = o->checkpoint_every,
                        .resume_dir = o->resume,
                        .overwrite_checkpoints = o->overwrite_checkpoints,
                        .keep_resumed_checkpoint = !o->compare.empty()};
    const bool root = ctx.world.rank() == 0;
    const double progress = o->log.empty() ? o->progress : 0.0;  // quiet beside a log
    ConsoleReport report(stdout, progress);
    std::vector<TrainObserver*> observers;
    if (root) observers.push_back(&report);
    const std::string label = to_string(options.tp_mode);
    std::vector<LossCurve> curves;
    TrainSummary first;
    // The step folder the first run resumed from: the comparison starts there too (--resume may
    // name the --checkpoint folder, whose newest checkpoint is then the first run's last one).
    std::filesystem::path start;
    {
      Trainer trainer(config, ctx.world);
      first = run_training(trainer, run, observers);
      curves.push_back(loss_curve(first, label));
      start = trainer.resumed_from();
    }
    if (!o->compare.empty()) {
      TrainConfig second = config;
      second.optimizer["tp_mode"] = o->compare;
      ConsoleReport compare_report(stdout, progress, o->compare);
      std::vector<TrainObserver*> compare_observers;
      if (root) {
        compare_observers.push_back(&compare_report);
        fmt::print("\nsecond run with tp-mode {} from the same start\n", o->compare);
      }
      Trainer trainer(second, ctx.world);
      TrainRunOptions again;  // no log or checkpoints; the same start
      again.resume_dir = start;
      const TrainSummary other = run_training(trainer, again, compare_observers);
      curves.push_back(loss_curve(other, o->compare));
      if (root) fmt::print("\n{}", format_comparison(first, label, other, o->compare));
    }
    if (!o->plot.empty()) {
      std::string plot_failure;
      if (root) {
        try {
          const std::string title = fmt::format(
              "distmuon train: {} ranks, hidden {}, ffn {}, {} layers, seed {}", ctx.world.size(),
              config.model.hidden, config.model.ffn, config.model.layers, config.train.seed);
          render_loss_plot(curves, first.unigram_entropy, title, o->plot);
          fmt::print("loss curves written to {}\n", o->plot);
        } catch (const std::exception& e) {
          plot_failure = e.what();
        }
      }
      agree_or_throw(ctx.world, plot_failure.empty(), "train --plot", plot_failure);
    }
  });
}

}  // namespace distmuon::cli
