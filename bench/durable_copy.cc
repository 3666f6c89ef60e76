// The benchmark's baseline for one row (bench/run_bench.sh): a durable copy of
// the same bytes the row reads and writes. `cp -r` of the whole checkpoint and
// `sync` is the baseline of a row that reads and writes the whole checkpoint;
// a row that reads and writes less (export: the fp32 masters, a quarter of a
// ZeRO checkpoint) pays the same fixed cost of making its output durable (the
// journal commit and the disk's cache flush of the final sync) on fewer bytes,
// so it is compared with a copy of as many bytes:
//
//   durable_copy SRC_FOLDER OUT_FOLDER READ_BYTES WRITE_BYTES
//
// copies min(READ, WRITE) bytes of the files under SRC, largest file first,
// into files of the same paths under OUT (copy_file_range, as cp does), reads the rest of
// READ from where the copy stopped when READ > WRITE, writes the rest of WRITE
// into one more file when WRITE > READ (copied again from the start of the
// largest file), then sync(2), as `cp -r SRC OUT && sync` does. Exits 1 when
// SRC holds fewer than READ bytes.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Input {
  std::string name;
  uint64_t size = 0;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "durable_copy: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// Every regular file under `folder` (paths relative to it), largest first.
void ListInto(const std::string& folder, const std::string& rel, std::vector<Input>* files) {
  const std::string dir = rel.empty() ? folder : folder + "/" + rel;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) Die(dir);
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string sub = rel.empty() ? name : rel + "/" + name;
    struct stat st;
    if (lstat((folder + "/" + sub).c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) ListInto(folder, sub, files);
    if (S_ISREG(st.st_mode)) files->push_back({sub, uint64_t(st.st_size)});
  }
  closedir(d);
}

std::vector<Input> ListFiles(const std::string& folder) {
  std::vector<Input> files;
  ListInto(folder, "", &files);
  std::sort(files.begin(), files.end(),
            [](const Input& a, const Input& b) { return a.size != b.size ? a.size > b.size : a.name < b.name; });
  return files;
}

// Creates the folders of `rel` under `out` (as cp -r does for a tree).
void MakeParents(const std::string& out, const std::string& rel) {
  for (size_t at = rel.find('/'); at != std::string::npos; at = rel.find('/', at + 1)) {
    const std::string dir = out + "/" + rel.substr(0, at);
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) Die(dir);
  }
}

// Copies `len` bytes of `src` from `offset` to the end of `dst`.
void CopyRange(int src, int dst, uint64_t offset, uint64_t len, const std::string& what) {
  loff_t in = static_cast<loff_t>(offset);
  std::vector<char> buf;
  while (len > 0) {
    ssize_t n = copy_file_range(src, &in, dst, nullptr, len, 0);
    if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL)) {  // read and write, as old cp
      buf.resize(8 << 20);
      n = pread(src, buf.data(), std::min<uint64_t>(len, buf.size()), in);
      if (n > 0 && write(dst, buf.data(), static_cast<size_t>(n)) != n) Die(what);
      if (n > 0) in += n;
    }
    if (n <= 0) Die(what);
    len -= static_cast<uint64_t>(n);
  }
}

void Read(int src, uint64_t offset, uint64_t len, const std::string& what) {
  std::vector<char> buf(8 << 20);
  while (len > 0) {
    ssize_t n = pread(src, buf.data(), std::min<uint64_t>(len, buf.size()), static_cast<off_t>(offset));
    if (n <= 0) Die(what);
    offset += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: durable_copy SRC_FOLDER OUT_FOLDER READ_BYTES WRITE_BYTES\n");
    return 2;
  }
  const std::string src = argv[1], out = argv[2];
  const uint64_t read_bytes = std::strtoull(argv[3], nullptr, 10), write_bytes = std::strtoull(argv[4], nullptr, 10);
  const std::vector<Input> files = ListFiles(src);
  uint64_t total = 0;
  for (const Input& f : files) total += f.size;
  if (total < read_bytes || files.empty()) {
    std::fprintf(stderr, "durable_copy: %s holds %llu bytes, fewer than %llu\n", src.c_str(),
                 static_cast<unsigned long long>(total), static_cast<unsigned long long>(read_bytes));
    return 1;
  }
  if (mkdir(out.c_str(), 0755) != 0) Die(out);
  uint64_t copy = std::min(read_bytes, write_bytes), extra_read = read_bytes - copy;
  for (const Input& f : files) {
    if (copy == 0 && extra_read == 0) break;
    const std::string path = src + "/" + f.name;
    const int in = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) Die(path);
    const uint64_t n = std::min(copy, f.size);
    if (n > 0) {
      const std::string dst_path = out + "/" + f.name;
      MakeParents(out, f.name);
      const int dst = open(dst_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (dst < 0) Die(dst_path);
      CopyRange(in, dst, 0, n, dst_path);
      if (close(dst) != 0) Die(dst_path);
      copy -= n;
    }
    const uint64_t r = std::min(extra_read, f.size - n);
    if (r > 0) Read(in, n, r, path);
    extra_read -= r;
    close(in);
  }
  if (write_bytes > read_bytes) {  // the rest of the output, from the (now cached) largest file
    const std::string path = src + "/" + files[0].name, dst_path = out + "/extra";
    const int in = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const int dst = open(dst_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (in < 0 || dst < 0) Die(dst_path);
    for (uint64_t left = write_bytes - read_bytes; left > 0;) {
      const uint64_t n = std::min(left, files[0].size);
      CopyRange(in, dst, 0, n, dst_path);
      left -= n;
    }
    if (close(dst) != 0) Die(dst_path);
    close(in);
  }
  sync();
  return 0;
}
