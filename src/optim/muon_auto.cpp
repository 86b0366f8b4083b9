// tp_mode=auto: TEMPORARY until the cost model lands.
#include "distmuon/error.h"
#include "optim/muon_impl.h"

namespace distmuon {

struct AutoState {};
std::unique_ptr<AutoState, void (*)(AutoState*)> make_auto_state(const MuonOptions&) {
  throw Error("tp_mode auto is not available in this build");
}
TpMode resolve_auto_mode(Muon::Impl&, ParamState&) {
  throw Error("tp_mode auto is not available in this build");
}
void restore_auto_decision(Muon::Impl&, const AutoKey&, TpMode) {}
std::map<AutoKey, TpMode> Muon::auto_decisions() const { return {}; }

}  // namespace distmuon
