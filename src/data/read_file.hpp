// Reading a whole data file (plain or gzip), shared by the text and CSV readers in src/data/.
#pragma once
#include <string>

namespace flux::data::detail {

/// The file's bytes; gzip files (magic 0x1f 0x8b, whatever their name) are inflated. A missing,
/// unreadable or corrupt file is a flux::Error "[api] ..." naming the path.
std::string read_text_file(const char* api, const std::string& path);

}  // namespace flux::data::detail
