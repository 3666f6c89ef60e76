#include "testing/damage.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "format/torch/mapped_file.h"
#include "format/torch/torch_file.h"

namespace ucp::testing {

absl::Status FlipByteInTensor(const std::string& path,
                              const std::function<const pickle::Value*(const pickle::Value& root)>& find,
                              double at) {
  int64_t offset = -1;
  {
    torch::OpenOptions lazy;
    lazy.verify_crc = false;
    UCP_ASSIGN_OR_RETURN(auto file, torch::TorchFile::Open(path, lazy));
    const pickle::Value* v = find(*file->root());
    if (v == nullptr) return absl::NotFoundError(absl::StrCat(path, ": no such tensor"));
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, file->GetTensor(*v));
    offset = (t.storage()->data() - file->mapped_file()->data()) + static_cast<int64_t>(static_cast<double>(t.storage()->nbytes()) * at);
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": open"));
  uint8_t byte = 0;
  absl::Status s;
  if (::pread(fd, &byte, 1, offset) != 1) {
    s = absl::ErrnoToStatus(errno, absl::StrCat(path, ": pread"));
  } else {
    byte ^= 0x40;
    if (::pwrite(fd, &byte, 1, offset) != 1) s = absl::ErrnoToStatus(errno, absl::StrCat(path, ": pwrite"));
  }
  ::close(fd);
  return s;
}

}  // namespace ucp::testing
