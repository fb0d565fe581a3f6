// gguf.cpp — see gguf.h. Layout (GGUF v3, little-endian):
//   magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
//   n_kv × { string key, u32 type, value }, n_tensors × { string name, u32 n_dims,
//   u64 ne[n_dims], u32 type, u64 offset }, padding to `general.alignment`, data.
// A string is u64 length + bytes; an array is u32 element type + u64 count + values.
#include "format/gguf.h"

#include "quants/quants.h"

#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_set>
#include <vector>

namespace llmd {

MappedFile::~MappedFile() {
    if (data_ != nullptr && size_ > 0) munmap(const_cast<uint8_t *>(data_), size_);
}

bool MappedFile::open(const std::string &path, std::string *error) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *error = "cannot open " + path + ": " + strerror(errno);
        return false;
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        *error = path + " is not a regular file";
        ::close(fd);
        return false;
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ == 0) {
        *error = path + " is empty";
        ::close(fd);
        return false;
    }
    void *p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) {
        size_ = 0;
        *error = "cannot map " + path + ": " + strerror(errno);
        return false;
    }
    data_ = static_cast<const uint8_t *>(p);
    return true;
}

namespace {

// Bounds-checked reading from the mapping; every failure names what was being read.
struct Cursor {
    const uint8_t *base;
    size_t size;
    size_t pos = 0;
    std::string *error;

    size_t left() const { return size - pos; }

    bool fail(const std::string &what) {
        *error = "GGUF: " + what + " (at byte " + std::to_string(pos) + " of " +
                 std::to_string(size) + ")";
        return false;
    }
    template <typename T> bool read(T *out, const char *what) {
        if (left() < sizeof(T)) return fail(std::string("truncated while reading ") + what);
        std::memcpy(out, base + pos, sizeof(T));
        pos += sizeof(T);
        return true;
    }
    bool read_string(std::string_view *out, const char *what) {
        uint64_t n = 0;
        if (!read(&n, what)) return false;
        if (n > left()) return fail(std::string(what) + " length " + std::to_string(n) + " exceeds the file");
        *out = std::string_view(reinterpret_cast<const char *>(base + pos), n);
        pos += n;
        return true;
    }
    bool skip(uint64_t n, const char *what) {
        if (n > left()) return fail(std::string("truncated ") + what);
        pos += n;
        return true;
    }
};

size_t scalar_size(uint32_t type) {
    switch (type) {
    case GGUF_U8: case GGUF_I8: case GGUF_BOOL: return 1;
    case GGUF_U16: case GGUF_I16: return 2;
    case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
    case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
    default: return 0;
    }
}

void widen_scalar(const uint8_t *p, uint32_t type, GGUFKV *kv) {
    switch (type) {
    case GGUF_U8: { uint8_t v; std::memcpy(&v, p, 1); kv->i = v; break; }
    case GGUF_I8: { int8_t v; std::memcpy(&v, p, 1); kv->i = v; break; }
    case GGUF_BOOL: { uint8_t v; std::memcpy(&v, p, 1); kv->i = v != 0; break; }
    case GGUF_U16: { uint16_t v; std::memcpy(&v, p, 2); kv->i = v; break; }
    case GGUF_I16: { int16_t v; std::memcpy(&v, p, 2); kv->i = v; break; }
    case GGUF_U32: { uint32_t v; std::memcpy(&v, p, 4); kv->i = v; break; }
    case GGUF_I32: { int32_t v; std::memcpy(&v, p, 4); kv->i = v; break; }
    case GGUF_U64: { uint64_t v; std::memcpy(&v, p, 8); kv->u = v; kv->i = static_cast<int64_t>(v); kv->f = static_cast<double>(v); return; }
    case GGUF_I64: { int64_t v; std::memcpy(&v, p, 8); kv->i = v; break; }
    case GGUF_F32: { float v; std::memcpy(&v, p, 4); kv->f = v; return; }
    case GGUF_F64: { double v; std::memcpy(&v, p, 8); kv->f = v; return; }
    default: return;
    }
    kv->u = static_cast<uint64_t>(kv->i);
    kv->f = static_cast<double>(kv->i);
}

// Skips a value of `type`; arrays of arrays are walked with a depth bound so a
// hostile file cannot recurse without end.
bool skip_value(Cursor &c, uint32_t type, int depth) {
    if (type == GGUF_STRING) {
        std::string_view s;
        return c.read_string(&s, "string value");
    }
    if (type == GGUF_ARRAY) {
        if (depth > 4) return c.fail("arrays nested too deeply");
        uint32_t et = 0;
        uint64_t n = 0;
        if (!c.read(&et, "array type") || !c.read(&n, "array count")) return false;
        if (const size_t es = scalar_size(et)) {
            if (n > c.left() / es) return c.fail("array of " + std::to_string(n) + " elements exceeds the file");
            return c.skip(n * es, "array");
        }
        if (et != GGUF_STRING && et != GGUF_ARRAY) return c.fail("unknown array element type " + std::to_string(et));
        // Each element takes at least 8 bytes (a length or a header), which bounds n.
        if (n > c.left() / 8) return c.fail("array of " + std::to_string(n) + " elements exceeds the file");
        for (uint64_t k = 0; k < n; ++k)
            if (!skip_value(c, et, depth + 1)) return false;
        return true;
    }
    const size_t es = scalar_size(type);
    if (es == 0) return c.fail("unknown value type " + std::to_string(type));
    return c.skip(es, "scalar value");
}

bool read_kv(Cursor &c, GGUFKV *kv) {
    if (!c.read_string(&kv->key, "metadata key")) return false;
    if (kv->key.empty()) return c.fail("empty metadata key");
    if (!c.read(&kv->type, "metadata value type")) return false;
    if (kv->type == GGUF_STRING) return c.read_string(&kv->str, "string value");
    if (kv->type != GGUF_ARRAY) {
        const size_t es = scalar_size(kv->type);
        if (es == 0) return c.fail("unknown value type " + std::to_string(kv->type) + " for key " + std::string(kv->key));
        if (c.left() < es) return c.fail("truncated value of " + std::string(kv->key));
        widen_scalar(c.base + c.pos, kv->type, kv);
        return c.skip(es, "scalar value");
    }
    const size_t start = c.pos;
    if (!c.read(&kv->arr_type, "array type") || !c.read(&kv->arr_count, "array count")) return false;
    if (kv->arr_type == GGUF_STRING) {
        if (kv->arr_count > c.left() / 8) return c.fail("string array " + std::string(kv->key) + " count exceeds the file");
        kv->arr_strings.reserve(kv->arr_count);
        for (uint64_t k = 0; k < kv->arr_count; ++k) {
            std::string_view s;
            if (!c.read_string(&s, "array string")) return false;
            kv->arr_strings.push_back(s);
        }
        return true;
    }
    if (scalar_size(kv->arr_type) != 0) kv->arr_data = c.base + c.pos + 0;
    c.pos = start;
    return skip_value(c, GGUF_ARRAY, 0);
}

} // namespace

std::unique_ptr<GGUFFile> GGUFFile::open(const std::string &path, std::string *error) {
    try {
        std::unique_ptr<GGUFFile> f(new GGUFFile());
        if (!f->map_.open(path, error)) return nullptr;
        if (!f->parse(error)) return nullptr;
        return f;
    } catch (const std::bad_alloc &) {
        *error = "GGUF: out of memory while reading " + path;
    } catch (const std::exception &e) {
        *error = std::string("GGUF: ") + e.what();
    }
    return nullptr;
}

bool GGUFFile::parse(std::string *error) {
    Cursor c{map_.data(), map_.size(), 0, error};
    uint32_t magic = 0;
    if (!c.read(&magic, "magic")) return false;
    if (std::memcmp(&magic, "GGUF", 4) != 0) return c.fail("not a GGUF file (bad magic)");
    if (!c.read(&version_, "version")) return false;
    if (version_ < 2 || version_ > 3) return c.fail("unsupported GGUF version " + std::to_string(version_));
    uint64_t n_tensors = 0, n_kv = 0;
    if (!c.read(&n_tensors, "tensor count") || !c.read(&n_kv, "metadata count")) return false;
    // A key-value pair takes at least 12 bytes and a tensor info at least 24.
    if (n_kv > c.left() / 12) return c.fail("metadata count " + std::to_string(n_kv) + " exceeds the file");
    if (n_tensors > c.left() / 24) return c.fail("tensor count " + std::to_string(n_tensors) + " exceeds the file");

    kvs_.resize(n_kv);
    std::unordered_set<std::string_view> keys;
    for (auto &kv : kvs_) {
        if (!read_kv(c, &kv)) return false;
        if (!keys.insert(kv.key).second) return c.fail("duplicate metadata key " + std::string(kv.key));
    }
    if (const GGUFKV *a = find("general.alignment")) {
        if (a->type != GGUF_U32 && a->type != GGUF_I32 && a->type != GGUF_U64)
            return c.fail("general.alignment has a non-integer type");
        if (a->i <= 0 || a->i > (1 << 20) || (a->i & (a->i - 1)) != 0)
            return c.fail("general.alignment " + std::to_string(a->i) + " is not a power of two");
        alignment_ = static_cast<uint64_t>(a->i);
    }

    tensors_.resize(n_tensors);
    std::unordered_set<std::string_view> names;
    for (auto &t : tensors_) {
        if (!c.read_string(&t.name, "tensor name")) return false;
        if (t.name.empty()) return c.fail("empty tensor name");
        if (!names.insert(t.name).second) return c.fail("duplicate tensor " + std::string(t.name));
        const std::string name(t.name);
        uint32_t n_dims = 0;
        if (!c.read(&n_dims, "tensor dimension count")) return false;
        if (n_dims < 1 || n_dims > 4) return c.fail("tensor " + name + " has " + std::to_string(n_dims) + " dimensions");
        t.n_dims = static_cast<int>(n_dims);
        uint64_t elems = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            uint64_t ne = 0;
            if (!c.read(&ne, "tensor shape")) return false;
            if (ne == 0 || ne > (uint64_t(1) << 40) || elems > (uint64_t(1) << 48) / ne)
                return c.fail("tensor " + name + " has an invalid shape");
            t.ne[d] = static_cast<int64_t>(ne);
            elems *= ne;
        }
        if (!c.read(&t.type, "tensor type") || !c.read(&t.offset, "tensor offset")) return false;
        // Sized from the traits table; whether the engine can compute with the type is
        // for binding to decide, so that it can name every tensor it cannot run.
        const TypeTraits *traits = type_traits(t.type);
        if (traits == nullptr) return c.fail("tensor " + name + " has unknown type " + std::to_string(t.type));
        if (t.ne[0] % traits->block_elems != 0)
            return c.fail("tensor " + name + " row is not a whole number of " + traits->name + " blocks");
        t.size = elems / static_cast<uint64_t>(traits->block_elems) * static_cast<uint64_t>(traits->block_bytes);
        if (t.offset % alignment_ != 0) return c.fail("tensor " + name + " offset is not aligned");
    }

    data_offset_ = c.pos;
    if (tensors_.empty()) return true;  // a vocab-only file may end right after its metadata, unpadded
    const uint64_t data_start = (c.pos + alignment_ - 1) / alignment_ * alignment_;
    if (data_start > map_.size()) return c.fail("data section starts past the end of the file");
    data_offset_ = data_start;
    const uint64_t data_size = map_.size() - data_start;
    for (auto &t : tensors_) {
        if (t.offset > data_size || t.size > data_size - t.offset)
            return c.fail("tensor " + std::string(t.name) + " data lies outside the file");
        t.data = map_.data() + data_start + t.offset;
    }
    // Each tensor's bytes its own (llama.cpp lays them out one after another and refuses
    // any other offset): tensors sharing bytes are a damaged file, not a model.
    std::vector<const GGUFTensor *> by_offset;
    for (const auto &t : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](const auto *a, const auto *b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i)
        if (by_offset[i - 1]->offset + by_offset[i - 1]->size > by_offset[i]->offset)
            return c.fail("tensors " + std::string(by_offset[i - 1]->name) + " and " + std::string(by_offset[i]->name) +
                          " share bytes of the file");
    return true;
}

const GGUFKV *GGUFFile::find(std::string_view key) const {
    for (const auto &kv : kvs_)
        if (kv.key == key) return &kv;
    return nullptr;
}

const GGUFTensor *GGUFFile::tensor(std::string_view name) const {
    for (const auto &t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

bool GGUFFile::get_int(std::string_view key, int64_t *out, std::string *error) const {
    const GGUFKV *kv = find(key);
    if (kv == nullptr) return false;
    if (kv->type == GGUF_STRING || kv->type == GGUF_ARRAY || kv->type == GGUF_F32 || kv->type == GGUF_F64) {
        *error = "GGUF: " + std::string(key) + " should be an integer";
        return false;
    }
    *out = kv->i;
    return true;
}

bool GGUFFile::get_float(std::string_view key, double *out, std::string *error) const {
    const GGUFKV *kv = find(key);
    if (kv == nullptr) return false;
    if (kv->type == GGUF_STRING || kv->type == GGUF_ARRAY || kv->type == GGUF_BOOL) {
        *error = "GGUF: " + std::string(key) + " should be a number";
        return false;
    }
    *out = kv->f;
    return true;
}

bool GGUFFile::get_string(std::string_view key, std::string_view *out, std::string *error) const {
    const GGUFKV *kv = find(key);
    if (kv == nullptr) return false;
    if (kv->type != GGUF_STRING) {
        *error = "GGUF: " + std::string(key) + " should be a string";
        return false;
    }
    *out = kv->str;
    return true;
}

bool GGUFFile::get_bool(std::string_view key, bool *out, std::string *error) const {
    const GGUFKV *kv = find(key);
    if (kv == nullptr) return false;
    if (kv->type != GGUF_BOOL) {
        *error = "GGUF: " + std::string(key) + " should be a bool";
        return false;
    }
    *out = kv->i != 0;
    return true;
}

} // namespace llmd
