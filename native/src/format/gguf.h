// gguf.h — a GGUF v2/v3 reader over a read-only memory map.
//
// Every count, length, offset, shape and type is checked against the bytes left
// in the file (and against overflow) before it is trusted, so a truncated or
// hostile file yields an error naming the problem instead of a crash. Tensor data
// stays in the mapping: nothing is copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmd {

enum GGUFValueType : uint32_t {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
    GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10,
    GGUF_I64 = 11, GGUF_F64 = 12,
};

// One metadata entry. Scalars are widened into i/u/f; strings and arrays point
// into the mapping (array elements may be unaligned: read them with memcpy).
struct GGUFKV {
    std::string_view key;
    uint32_t type = 0;
    int64_t i = 0;       // integer and bool scalars
    uint64_t u = 0;
    double f = 0.0;      // float scalars (and integers, widened)
    std::string_view str;
    uint32_t arr_type = 0;
    uint64_t arr_count = 0;
    const uint8_t *arr_data = nullptr;        // numeric arrays
    std::vector<std::string_view> arr_strings; // string arrays
};

struct GGUFTensor {
    std::string_view name;
    uint32_t type = 0;
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1}; // ne[0] is the contiguous (row) dimension
    uint64_t offset = 0;          // relative to the data section
    uint64_t size = 0;            // bytes
    const uint8_t *data = nullptr;
};

class MappedFile {
public:
    MappedFile() = default;
    MappedFile(const MappedFile &) = delete;
    MappedFile &operator=(const MappedFile &) = delete;
    ~MappedFile();
    bool open(const std::string &path, std::string *error);
    const uint8_t *data() const { return data_; }
    size_t size() const { return size_; }

private:
    const uint8_t *data_ = nullptr;
    size_t size_ = 0;
};

class GGUFFile {
public:
    static std::unique_ptr<GGUFFile> open(const std::string &path, std::string *error);

    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    const std::vector<GGUFKV> &metadata() const { return kvs_; }
    const std::vector<GGUFTensor> &tensors() const { return tensors_; }
    // Bytes before the tensor data: header, metadata and tensor table (and padding).
    uint64_t data_offset() const { return data_offset_; }
    uint64_t file_size() const { return map_.size(); }

    const GGUFKV *find(std::string_view key) const;
    const GGUFTensor *tensor(std::string_view name) const;

    // Typed look-ups: false if absent; *error set if present with a wrong type.
    bool get_int(std::string_view key, int64_t *out, std::string *error) const;
    bool get_float(std::string_view key, double *out, std::string *error) const;
    bool get_string(std::string_view key, std::string_view *out, std::string *error) const;
    bool get_bool(std::string_view key, bool *out, std::string *error) const;

private:
    bool parse(std::string *error);

    MappedFile map_;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<GGUFKV> kvs_;
    std::vector<GGUFTensor> tensors_;
};

} // namespace llmd
