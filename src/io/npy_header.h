#pragma once
// The header of a .npy file: the Python dict literal that NumPy writes, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// parsed by a small recursive-descent parser (no regex) that accepts what NumPy's reader accepts
// for these values and refuses what it refuses: the keys are exactly descr, fortran_order and
// shape, each once; descr is a string, fortran_order True or False, shape a tuple of integers.
// It is stricter in three places: a duplicated key (Python keeps the last one) is refused, and so
// are negative dimensions (numpy.load fails on them later) and integers written other than in
// decimal (0x10, 1_000, True as 1).

#include <string>
#include <string_view>
#include <vector>

#include "distmuon/matrix.h"

namespace distmuon::detail {

struct NpyHeader {
  std::string descr;  // the dtype string, e.g. "<f4"
  bool fortran_order = false;
  std::vector<Index> shape;  // each >= 0
};

// Throws distmuon::Error saying what is wrong and where (without the file name).
NpyHeader parse_npy_header(std::string_view text);

}  // namespace distmuon::detail
