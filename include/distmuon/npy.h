#pragma once
// NumPy .npy files (format versions 1.0-3.0): 2-D float32 ('<f4'), C order.
// Reading validates magic, version, header, dtype, order, rank and size, and throws
// distmuon::Error naming the file and the problem. Writing is atomic (temporary file, fsync,
// rename; write_file_atomic in file_io.h), so a failed write never leaves a partial output file.

#include <filesystem>

#include "distmuon/matrix.h"

namespace distmuon {

Matrix read_npy(const std::filesystem::path& path);
void write_npy(const std::filesystem::path& path, ConstMatrixView m);

}  // namespace distmuon
