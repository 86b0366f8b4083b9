// tp_mode=auto: TEMPORARY until the cost model lands.
#include "distmuon/error.h"
#include "optim/muon_impl.h"

namespace distmuon {

TpMode resolve_auto_mode(Muon::Impl&, ParamState&) {
  throw Error("tp_mode auto is not available in this build");
}
void restore_auto_decision(Muon::Impl&, const AutoKey&, TpMode) {}
std::map<AutoKey, TpMode> Muon::auto_decisions() const {
  return {};
}

}  // namespace distmuon
