#pragma once
// The headers that most tests include, precompiled once for every test executable
// (tests/CMakeLists.txt): parsing them is most of a test file's compile time. A test still
// includes what it uses; this header only makes that cheap.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "test_util.h"
