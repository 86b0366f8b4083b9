// `distmuon orthogonalize IN.npy OUT.npy`: Newton-Schulz of a matrix read from a .npy file.
#include <fmt/format.h>

#include "commands.h"
#include "distmuon/error.h"
#include "distmuon/npy.h"

namespace distmuon::cli {

void add_orthogonalize_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("orthogonalize", "Orthogonalise a 2-D float32 .npy matrix");
  struct Opts {
    std::string in, out;
    NsCliOptions ns;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("input", o->in, "Input .npy (float32, C order, 2-D)")->required();
  cmd->add_option("output", o->out, "Output .npy")->required();
  o->ns.add_to(*cmd);
  cmd->callback([o, &ctx] {
    const NsOptions opts = o->ns.resolve();
    (void)ctx;
    Matrix x = read_npy(o->in);
    newton_schulz_inplace(x.view(), opts);
    write_npy(o->out, x.view());
  });
}

}  // namespace distmuon::cli
