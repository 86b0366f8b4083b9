// .npy reading and writing: round trips, every malformation the reader rejects, and atomic writes.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "distmuon/error.h"
#include "distmuon/npy.h"
#include "test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class Npy : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("distmuon_npy_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// A .npy file with a hand-written header (padded like numpy) and raw data bytes.
std::string npy_bytes(const std::string& dict, std::size_t data_bytes, int major = 1) {
  std::string header = dict;
  const std::size_t preamble = major == 1 ? 10 : 12;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  const std::size_t n = header.size();
  out.push_back(static_cast<char>(n & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  if (major != 1) {
    out.push_back(0);
    out.push_back(0);
  }
  out += header;
  for (std::size_t i = 0; i < data_bytes; ++i)
    out.push_back(static_cast<char>(i % 7));
  return out;
}

void write_raw(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string f4_dict(const std::string& shape, const std::string& descr = "<f4",
                    const std::string& fortran = "False") {
  return fmt::format("{{'descr': '{}', 'fortran_order': {}, 'shape': {}, }}", descr, fortran,
                     shape);
}

// Reading must fail with distmuon::Error whose message names the file and contains `what`.
void expect_read_error(const fs::path& p, const std::string& what) {
  try {
    read_npy(p);
    ADD_FAILURE() << "read_npy accepted " << p;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "expected '" << what << "' in: " << msg;
  }
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    out.push_back(e.path().filename());
  return out;
}

TEST_F(Npy, RoundTripKeepsShapeAndBits) {
  for (auto [m, n] : {std::pair<Index, Index>{3, 5}, {1, 1}, {64, 17}, {0, 4}, {4, 0}}) {
    const Matrix a = test::random_matrix(m, n, 3);
    const fs::path p = dir_ / fmt::format("a_{}x{}.npy", m, n);
    write_npy(p, a.view());
    const Matrix b = read_npy(p);
    ASSERT_EQ(b.rows(), m);
    ASSERT_EQ(b.cols(), n);
    for (Index i = 0; i < a.size(); ++i)
      EXPECT_EQ(a.data()[i], b.data()[i]);
  }
}

TEST_F(Npy, WritesNumpyLayoutFromStridedViews) {
  Matrix big = test::random_matrix(6, 9, 4);
  const fs::path p = dir_ / "block.npy";
  write_npy(p, big.view().block(1, 2, 3, 4));
  // Magic, version 1.0, header padded so that the data starts at a multiple of 64 bytes.
  std::ifstream in(p, std::ios::binary);
  std::string head(10, '\0');
  in.read(head.data(), 10);
  EXPECT_EQ(head.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const std::size_t header_len =
      static_cast<unsigned char>(head[8]) | (static_cast<unsigned char>(head[9]) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_EQ(fs::file_size(p), 10 + header_len + 3 * 4 * sizeof(float));
  const Matrix b = read_npy(p);
  for (Index i = 0; i < 3; ++i)
    for (Index j = 0; j < 4; ++j)
      EXPECT_EQ(b(i, j), big(1 + i, 2 + j));
}

TEST_F(Npy, ReadsVersion2Headers) {
  const fs::path p = dir_ / "v2.npy";
  write_raw(p, npy_bytes(f4_dict("(2, 3)"), 24, 2));
  const Matrix m = read_npy(p);
  EXPECT_EQ(m.rows(), 2);
  EXPECT_EQ(m.cols(), 3);
}

TEST_F(Npy, RejectsEachMalformation) {
  const auto check = [&](const std::string& name, const std::string& bytes,
                         const std::string& what) {
    SCOPED_TRACE(name);
    const fs::path p = dir_ / (name + ".npy");
    write_raw(p, bytes);
    expect_read_error(p, what);
  };
  const std::string good = npy_bytes(f4_dict("(2, 3)"), 24);
  check("empty", "", "bad magic");
  check("magic", "\x93NUMPZ" + good.substr(6), "bad magic");
  check("text", "hello world, not an array", "bad magic");
  check("version", good.substr(0, 6) + "\x04" + good.substr(7), "unsupported format version 4.0");
  check("short_preamble", good.substr(0, 9), "truncated header length");
  check("short_header", good.substr(0, 30), "truncated header");
  check("float64", npy_bytes(f4_dict("(2, 3)", "<f8"), 48), "dtype '<f8'");
  check("big_endian", npy_bytes(f4_dict("(2, 3)", ">f4"), 24), "dtype '>f4'");
  check("int32", npy_bytes(f4_dict("(2, 3)", "<i4"), 24), "dtype '<i4'");
  check("fortran", npy_bytes(f4_dict("(2, 3)", "<f4", "True"), 24), "Fortran");
  check("rank1", npy_bytes(f4_dict("(6,)"), 24), "rank 1");
  check("rank3", npy_bytes(f4_dict("(1, 2, 3)"), 24), "rank 3");
  check("scalar", npy_bytes(f4_dict("()"), 4), "rank 0");
  check("no_shape", npy_bytes("{'descr': '<f4', 'fortran_order': False, }", 24), "'shape'");
  check("truncated", good.substr(0, good.size() - 1), "truncated data");
  check("no_data", npy_bytes(f4_dict("(2, 3)"), 0), "truncated data");
  check("trailing", good + "xy", "2 unexpected bytes");
  // A corrupt shape must be reported, not allocated.
  check("huge", npy_bytes(f4_dict("(4000000000, 4000000000)"), 24), "truncated data");
  check("absurd", npy_bytes(f4_dict("(99999999999999999999, 2)"), 24), "implausible");
  expect_read_error(dir_ / "missing.npy", "cannot open");
}

// Headers NumPy reads (checked with numpy.load of NumPy 1.24) are read with their shape: any key
// order, double quotes, no trailing comma, line breaks and tabs, a trailing comma in the shape,
// explicit signs, version 3.0.
TEST_F(Npy, ParsesTheHeaderLiteralAsNumpyDoes) {
  const std::vector<std::string> dicts = {
      "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
      "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}",
      "{'descr':'<f4','fortran_order':False,'shape':(2,3,),}",
      "{\n  'descr': '<f4',\n\t'fortran_order': False,\n  'shape': ( 2 , +3 )\n}",
      "{'descr': 'f4', 'fortran_order': False, 'shape': (2, 3)}",
      // numpy.load reads these too: '|f4' is float32 ("byte order not applicable"), and the
      // shape is a Python literal, whose integers may group digits with underscores.
      "{'descr': '|f4', 'fortran_order': False, 'shape': (2, 3)}"};
  for (std::size_t i = 0; i < dicts.size(); ++i) {
    SCOPED_TRACE(dicts[i]);
    for (int major : {1, 3}) {
      const fs::path p = dir_ / fmt::format("ok{}_v{}.npy", i, major);
      write_raw(p, npy_bytes(dicts[i], 24, major));
      const Matrix m = read_npy(p);
      EXPECT_EQ(m.rows(), 2);
      EXPECT_EQ(m.cols(), 3);
    }
  }
}

// A shape's integers may group digits with single underscores, as Python's literals (and so
// numpy.load) allow: (1_0, 3) is 10 x 3. Misplaced underscores are refused as Python refuses them.
TEST_F(Npy, ReadsDigitGroupsInTheShape) {
  const fs::path p = dir_ / "grouped.npy";
  write_raw(p, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1_0, 3)}", 120));
  const Matrix m = read_npy(p);
  EXPECT_EQ(m.rows(), 10);
  EXPECT_EQ(m.cols(), 3);
  for (const char* shape : {"(1__0, 3)", "(10_, 3)", "(_10, 3)", "(0_2, 3)"}) {
    SCOPED_TRACE(shape);
    const fs::path bad = dir_ / "bad_grouped.npy";
    write_raw(bad, npy_bytes(fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': {}}}",
                                         shape),
                             120));
    expect_read_error(bad, "not an integer");
  }
}

// Headers numpy.load (NumPy 1.24) refuses, each refused here with what is wrong; the old regex
// reader took -3 as 3 and (2.0, 3) as (2, 0, 3). Refused here although NumPy reads them (no .npy
// writer produces them): a duplicated key (Python keeps the last one, so the old reader and
// NumPy read different shapes), a hexadecimal dimension, a structured dtype.
TEST_F(Npy, RefusesHeadersNumpyRefuses) {
  const auto check = [&](const std::string& name, const std::string& dict,
                         const std::string& what) {
    SCOPED_TRACE(name);
    const fs::path p = dir_ / (name + ".npy");
    write_raw(p, npy_bytes(dict, 24));
    expect_read_error(p, what);
  };
  check("negative", f4_dict("(-2, -3)"), "negative dimension -2");
  check("negative_one", f4_dict("(2, -3)"), "negative dimension -3");
  check("float", f4_dict("(2.0, 3)"), "'shape' has 2.0, not an integer");
  check("exponent", f4_dict("(2, 3e0)"), "'shape' has 3e0, not an integer");
  check("hex", f4_dict("(0x2, 3)"), "not an integer");
  check("leading_zero", f4_dict("(02, 3)"), "not an integer");
  check("bool_dim", f4_dict("(True, 3)"), "not an integer");
  check("not_tuple", f4_dict("[2, 3]"), "'shape' is not a tuple");
  check("int_shape", f4_dict("(6)"), "a 1-tuple needs a comma");
  check("dup_shape", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'shape': (3, 2)}",
        "key 'shape' appears twice");
  check("dup_descr", "{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}",
        "key 'descr' appears twice");
  check("extra_key", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}",
        "unexpected key 'x'");
  check("no_descr", "{'fortran_order': False, 'shape': (2, 3)}", "no 'descr' field");
  check("no_order", "{'descr': '<f4', 'shape': (2, 3)}", "no 'fortran_order' field");
  check("order_string", f4_dict("(2, 3)", "<f4", "'False'"), "not True or False");
  check("order_int", f4_dict("(2, 3)", "<f4", "0"), "not True or False");
  check("structured", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 3)}",
        "not a dtype string");
  check("not_dict", "('<f4', False, (2, 3))", "expected '{'");
  check("unclosed", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", "expected ','");
  check("after", f4_dict("(2, 3)") + " x", "unexpected text after the dict");
  check("misquoted", "{'descr: '<f4', 'fortran_order': False, 'shape': (2, 3)}", "unexpected key");
  check("unterminated", "{'descr': '<f4", "unterminated string");
  check("no_colon", "{'descr' '<f4', 'fortran_order': False, 'shape': (2, 3)}", "expected ':'");
  check("missing_comma", "{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3)}",
        "expected ',' or '}'");
}

// A zero dimension leaves no data to bound the other one: 999999999999 x 0 used to pass the size
// check and run out of memory downstream. The other dimension may be at most 2^24.
TEST_F(Npy, EmptyMatrixWithAHugeDimensionIsRefused) {
  for (const std::string shape : {"(999999999999, 0)", "(0, 999999999999)", "(16777217, 0)"}) {
    const fs::path p = dir_ / "empty.npy";
    write_raw(p, npy_bytes(f4_dict(shape), 0));
    expect_read_error(p, "an empty matrix of shape " + shape + " is implausible");
  }
  const fs::path p = dir_ / "edge.npy";
  write_raw(p, npy_bytes(f4_dict("(0, 16777216)"), 0));
  const Matrix m = read_npy(p);
  EXPECT_EQ(m.rows(), 0);
  EXPECT_EQ(m.cols(), 16777216);
}

TEST_F(Npy, AtomicWriteReplacesTheFileWhole) {
  const fs::path p = dir_ / "out.npy";
  write_npy(p, test::random_matrix(2, 2, 1).view());
  const Matrix b = test::random_matrix(5, 3, 2);
  write_npy(p, b.view());
  EXPECT_EQ(read_npy(p).rows(), 5);
  EXPECT_EQ(files_in(dir_), std::vector<fs::path>{"out.npy"});  // no temporary left behind
}

TEST_F(Npy, FailedWriteLeavesNoFile) {
  const Matrix a = test::random_matrix(4, 4, 1);
  // Into a directory that does not exist: nothing can be created.
  EXPECT_THROW(write_npy(dir_ / "no_such_dir" / "out.npy", a.view()), Error);
  // Onto an existing directory: refused before a temporary is written.
  fs::create_directories(dir_ / "target.npy");
  try {
    write_npy(dir_ / "target.npy", a.view());
    ADD_FAILURE() << "writing over a directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(files_in(dir_), std::vector<fs::path>{"target.npy"});
  EXPECT_TRUE(fs::is_directory(dir_ / "target.npy"));
}

// Over the process's file-size limit (ulimit -f): refused before anything is written, naming
// the limit, with SIGXFSZ at its default action (which would end this process at the first write
// past the limit, leaving out.npy.tmp.PID behind); no file, no temporary left.
TEST_F(Npy, FileSizeLimitIsRefusedBeforeWriting) {
  const Matrix a = test::random_matrix(64, 64, 1);  // 16 KiB of data
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  ASSERT_NE(std::signal(SIGXFSZ, SIG_DFL), SIG_ERR);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string error;
  try {
    write_npy(dir_ / "out.npy", a.view());
  } catch (const Error& e) {
    error = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_NE(error.find("over this process's file-size limit of 4096 bytes (ulimit -f)"),
            std::string::npos)
      << error;
  EXPECT_TRUE(files_in(dir_).empty());
  write_npy(dir_ / "out.npy", a.view());
  EXPECT_EQ(files_in(dir_), std::vector<fs::path>{"out.npy"});
}

// An output that exists and is not a regular file (a FIFO, a device node) is refused and left as
// it was: before the check, the atomic rename replaced it with a regular file.
TEST_F(Npy, WriteRefusesWhatIsNotARegularFile) {
  const Matrix a = test::random_matrix(4, 4, 1);
  const fs::path fifo = dir_ / "fifo.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  try {
    write_npy(fifo, a.view());
    ADD_FAILURE() << "writing over a FIFO succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a FIFO"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
  // A regular file and a new path are still written.
  write_npy(dir_ / "new.npy", a.view());
  write_npy(dir_ / "new.npy", a.view());
  EXPECT_EQ(read_npy(dir_ / "new.npy").rows(), 4);
  // A character device like /dev/null (mknod needs root; a copy, so the real one is never at risk).
  const fs::path null = dir_ / "null";
  if (::mknod(null.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) != 0) {
    GTEST_SKIP() << "mknod of a character device needs root";
  }
  try {
    write_npy(null, a.view());
    ADD_FAILURE() << "writing over a device succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a device"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_character_file(null));
}

}  // namespace
}  // namespace distmuon
