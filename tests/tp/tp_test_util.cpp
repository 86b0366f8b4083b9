#include "tp_test_util.h"

#include "test_util.h"

namespace distmuon::test {

std::vector<Communicator> tp_groups() {
  std::vector<Communicator> groups = {world()};
  if (world().size() == 4) groups.push_back(world().split(world().rank() / 2, world().rank()));
  return groups;
}

NsOptions ns_options(const std::string& set, bool syrk) {
  NsOptions o;
  o.coefficients = coefficient_set(set);
  o.steps = set == "polar_express" ? 8 : (set == "deepseekv4" ? 10 : 5);
  o.use_syrk = syrk;
  return o;
}

Matrix my_shard(ConstMatrixView full, int dim, const Communicator& group) {
  return shard_of(full, dim, group.size(), group.rank());
}

}  // namespace distmuon::test
