#include "unwind_cfi.h"

#include <cstddef>
#include <cstring>
#include <limits>

namespace allocscope {

namespace {

constexpr uint64_t kRbp = 6;
constexpr uint64_t kRsp = 7;
constexpr uint64_t kRip = 16;
constexpr uint64_t kNoRegister = std::numeric_limits<uint64_t>::max();

// Bounds-checked reader over .eh_frame bytes: an overrun sets failed() and
// yields zeros, so the interpreter checks once per instruction.
class CfiCursor {
  public:
    CfiCursor(const uint8_t* pos, const uint8_t* end) : pos_(pos), end_(end) {}

    bool failed() const { return failed_; }
    bool at_end() const { return pos_ >= end_; }
    const uint8_t* pos() const { return pos_; }
    size_t remaining() const { return static_cast<size_t>(end_ - pos_); }

    template <typename T>
    T fixed() {
        T value{};
        if (remaining() < sizeof(T)) return fail<T>();
        std::memcpy(&value, pos_, sizeof(T));
        pos_ += sizeof(T);
        return value;
    }

    uint64_t uleb() {
        uint64_t value = 0;
        for (unsigned shift = 0; pos_ < end_; shift += 7) {
            uint8_t byte = *pos_++;
            if (shift < 64) value |= static_cast<uint64_t>(byte & 0x7f) << shift;
            if ((byte & 0x80) == 0) return value;
        }
        return fail<uint64_t>();
    }

    int64_t sleb() {
        uint64_t value = 0;
        for (unsigned shift = 0; pos_ < end_;) {
            uint8_t byte = *pos_++;
            if (shift < 64) value |= static_cast<uint64_t>(byte & 0x7f) << shift;
            shift += 7;
            if ((byte & 0x80) == 0) {
                if (shift < 64 && (byte & 0x40) != 0) value |= ~uint64_t{0} << shift;
                return static_cast<int64_t>(value);
            }
        }
        return fail<int64_t>();
    }

    void skip(uint64_t count) {
        if (count > remaining()) {
            fail<int>();
            return;
        }
        pos_ += count;
    }

    // Skips a DW_EH_PE-encoded value; only its size matters here.
    void skip_encoded(uint8_t encoding) {
        if ((encoding & 0x70) == 0x50) {  // DW_EH_PE_aligned
            fail<int>();
            return;
        }
        switch (encoding & 0x0f) {
            case 0x00:  // absptr
            case 0x04:  // udata8
            case 0x0c:  // sdata8
                skip(8);
                break;
            case 0x02:  // udata2
            case 0x0a:  // sdata2
                skip(2);
                break;
            case 0x03:  // udata4
            case 0x0b:  // sdata4
                skip(4);
                break;
            case 0x01:
                uleb();
                break;
            case 0x09:
                sleb();
                break;
            default:
                fail<int>();
        }
    }

  private:
    template <typename T>
    T fail() {
        failed_ = true;
        pos_ = end_;
        return T{};
    }

    const uint8_t* pos_;
    const uint8_t* end_;
    bool failed_ = false;
};

enum class SavedAs : uint8_t { kSameValue, kCfaOffset, kUndefined, kUnsupported };

struct RegisterRule {
    SavedAs how = SavedAs::kSameValue;
    int64_t offset = 0;
};

// One row of the CFA table, restricted to the registers the walk follows.
// Rules of other registers are parsed and dropped: the walk never reads them.
struct CfaRow {
    uint64_t cfa_register = kNoRegister;  // kNoRegister: undefined or an expression
    int64_t cfa_offset = 0;
    RegisterRule rbp;
    RegisterRule rsp;
    RegisterRule rip;

    RegisterRule* rule_of(uint64_t reg) {
        return const_cast<RegisterRule*>(static_cast<const CfaRow*>(this)->rule_of(reg));
    }
    const RegisterRule* rule_of(uint64_t reg) const {
        switch (reg) {
            case kRbp:
                return &rbp;
            case kRsp:
                return &rsp;
            case kRip:
                return &rip;
            default:
                return nullptr;
        }
    }
};

struct CieInfo {
    uint64_t code_align = 0;
    int64_t data_align = 0;
    uint8_t fde_encoding = 0;  // DW_EH_PE_absptr unless 'R' says otherwise
    bool has_augmentation_data = false;
    const uint8_t* program = nullptr;
    const uint8_t* program_end = nullptr;
};

uint32_t load_u32(const uint8_t* pos) {
    uint32_t value;
    std::memcpy(&value, pos, sizeof(value));
    return value;
}

// Returns false for CIEs the walk must not trust: signal frames ('S'), a
// return-address column other than rip, unknown augmentations, 64-bit DWARF.
bool parse_cie(const uint8_t* cie, CieInfo& info) {
    uint32_t length = load_u32(cie);
    if (length == 0 || length == 0xffffffff) return false;
    CfiCursor cur(cie + 4, cie + 4 + length);
    if (cur.fixed<uint32_t>() != 0) return false;  // .eh_frame CIE id
    uint8_t version = cur.fixed<uint8_t>();
    if (version != 1 && version != 3 && version != 4) return false;
    const char* augmentation = reinterpret_cast<const char*>(cur.pos());
    size_t augmentation_length = strnlen(augmentation, cur.remaining());
    cur.skip(augmentation_length + 1);
    if (version == 4) {
        if (cur.fixed<uint8_t>() != 8 || cur.fixed<uint8_t>() != 0) return false;
    }
    info.code_align = cur.uleb();
    info.data_align = cur.sleb();
    uint64_t ra_column = version == 1 ? cur.fixed<uint8_t>() : cur.uleb();
    if (ra_column != kRip || cur.failed()) return false;

    if (augmentation_length == 0) {
        info.program = cur.pos();
        info.program_end = cie + 4 + length;
        return true;
    }
    if (augmentation[0] != 'z') return false;
    info.has_augmentation_data = true;
    uint64_t data_length = cur.uleb();
    if (cur.failed() || data_length > cur.remaining()) return false;
    const uint8_t* data_end = cur.pos() + data_length;
    for (size_t i = 1; i < augmentation_length && !cur.failed(); ++i) {
        switch (augmentation[i]) {
            case 'R':
                info.fde_encoding = cur.fixed<uint8_t>();
                break;
            case 'P':
                cur.skip_encoded(cur.fixed<uint8_t>());
                break;
            case 'L':
                cur.fixed<uint8_t>();
                break;
            default:  // 'S' (signal frame) and anything newer
                return false;
        }
    }
    if (cur.failed() || cur.pos() > data_end) return false;
    info.program = data_end;
    info.program_end = cie + 4 + length;
    return info.program <= info.program_end;
}

// Runs a CFA program, stopping before the first row that starts after
// `target` (an offset from the function start). `initial` is the row after
// the CIE program, the state DW_CFA_restore returns to.
bool run_cfa_program(CfiCursor cur, const CieInfo& cie, uint64_t target, const CfaRow& initial,
                     CfaRow& row) {
    constexpr size_t kMaxRemembered = 8;
    CfaRow remembered[kMaxRemembered];
    size_t remembered_count = 0;
    uint64_t location = 0;
    auto past_target = [&](uint64_t delta) {
        location += delta * cie.code_align;
        return location > target;
    };
    auto set_offset = [&](uint64_t reg, int64_t offset) {
        if (RegisterRule* rule = row.rule_of(reg)) *rule = {SavedAs::kCfaOffset, offset};
    };
    auto set_how = [&](uint64_t reg, SavedAs how) {
        if (RegisterRule* rule = row.rule_of(reg)) *rule = {how, 0};
    };
    auto restore = [&](uint64_t reg) {
        if (RegisterRule* rule = row.rule_of(reg)) *rule = *initial.rule_of(reg);
    };

    while (!cur.at_end()) {
        uint8_t op = cur.fixed<uint8_t>();
        uint8_t low_bits = op & 0x3f;
        switch (op >> 6) {
            case 1:  // DW_CFA_advance_loc
                if (past_target(low_bits)) return true;
                continue;
            case 2:  // DW_CFA_offset
                set_offset(low_bits, static_cast<int64_t>(cur.uleb()) * cie.data_align);
                if (cur.failed()) return false;
                continue;
            case 3:  // DW_CFA_restore
                restore(low_bits);
                continue;
            default:
                break;
        }
        switch (op) {
            case 0x00:  // DW_CFA_nop
                break;
            case 0x02:  // DW_CFA_advance_loc1
                if (past_target(cur.fixed<uint8_t>())) return !cur.failed();
                break;
            case 0x03:  // DW_CFA_advance_loc2
                if (past_target(cur.fixed<uint16_t>())) return !cur.failed();
                break;
            case 0x04:  // DW_CFA_advance_loc4
                if (past_target(cur.fixed<uint32_t>())) return !cur.failed();
                break;
            case 0x05: {  // DW_CFA_offset_extended
                uint64_t reg = cur.uleb();
                set_offset(reg, static_cast<int64_t>(cur.uleb()) * cie.data_align);
                break;
            }
            case 0x06:  // DW_CFA_restore_extended
                restore(cur.uleb());
                break;
            case 0x07:  // DW_CFA_undefined
                set_how(cur.uleb(), SavedAs::kUndefined);
                break;
            case 0x08:  // DW_CFA_same_value
                set_how(cur.uleb(), SavedAs::kSameValue);
                break;
            case 0x09:  // DW_CFA_register
                set_how(cur.uleb(), SavedAs::kUnsupported);
                cur.uleb();
                break;
            case 0x0a:  // DW_CFA_remember_state; the CFA is part of the state, as in libgcc
                if (remembered_count == kMaxRemembered) return false;
                remembered[remembered_count++] = row;
                break;
            case 0x0b:  // DW_CFA_restore_state
                if (remembered_count == 0) return false;
                row = remembered[--remembered_count];
                break;
            case 0x0c:  // DW_CFA_def_cfa
                row.cfa_register = cur.uleb();
                row.cfa_offset = static_cast<int64_t>(cur.uleb());
                break;
            case 0x0d:  // DW_CFA_def_cfa_register
                row.cfa_register = cur.uleb();
                break;
            case 0x0e:  // DW_CFA_def_cfa_offset
                row.cfa_offset = static_cast<int64_t>(cur.uleb());
                break;
            case 0x0f:  // DW_CFA_def_cfa_expression
                row.cfa_register = kNoRegister;
                cur.skip(cur.uleb());
                break;
            case 0x10:    // DW_CFA_expression
            case 0x16: {  // DW_CFA_val_expression
                set_how(cur.uleb(), SavedAs::kUnsupported);
                cur.skip(cur.uleb());
                break;
            }
            case 0x11: {  // DW_CFA_offset_extended_sf
                uint64_t reg = cur.uleb();
                set_offset(reg, cur.sleb() * cie.data_align);
                break;
            }
            case 0x12:  // DW_CFA_def_cfa_sf
                row.cfa_register = cur.uleb();
                row.cfa_offset = cur.sleb() * cie.data_align;
                break;
            case 0x13:  // DW_CFA_def_cfa_offset_sf
                row.cfa_offset = cur.sleb() * cie.data_align;
                break;
            case 0x14:  // DW_CFA_val_offset
                set_how(cur.uleb(), SavedAs::kUnsupported);
                cur.uleb();
                break;
            case 0x15:  // DW_CFA_val_offset_sf
                set_how(cur.uleb(), SavedAs::kUnsupported);
                cur.sleb();
                break;
            case 0x2e:  // DW_CFA_GNU_args_size: only matters when landing in a handler
                cur.uleb();
                break;
            case 0x2f: {  // DW_CFA_GNU_negative_offset_extended
                uint64_t reg = cur.uleb();
                set_offset(reg, -static_cast<int64_t>(cur.uleb()) * cie.data_align);
                break;
            }
            default:  // DW_CFA_set_loc (needs pointer decoding), vendor ops
                return false;
        }
        if (cur.failed()) return false;
    }
    return !cur.failed();
}

FrameRule to_frame_rule(const CfaRow& row) {
    FrameRule rule;
    rule.kind = FrameRuleKind::kFallback;
    if (row.rip.how == SavedAs::kUndefined) {
        rule.kind = FrameRuleKind::kOutermost;
        return rule;
    }
    if (row.rip.how != SavedAs::kCfaOffset || row.rip.offset != -8) return rule;
    if (row.cfa_register != kRsp && row.cfa_register != kRbp) return rule;
    if (row.rsp.how != SavedAs::kSameValue) return rule;
    if (row.cfa_offset < std::numeric_limits<int32_t>::min() ||
        row.cfa_offset > std::numeric_limits<int32_t>::max()) {
        return rule;
    }
    rule.cfa_offset = static_cast<int32_t>(row.cfa_offset);
    if (row.cfa_register == kRbp) rule.flags |= FrameRule::kCfaFromRbp;
    switch (row.rbp.how) {
        case SavedAs::kSameValue:
        case SavedAs::kUndefined:  // libgcc treats undefined callee-saved registers as unchanged
            break;
        case SavedAs::kCfaOffset:
            if (row.rbp.offset < std::numeric_limits<int16_t>::min() ||
                row.rbp.offset > std::numeric_limits<int16_t>::max()) {
                return rule;
            }
            rule.rbp_offset = static_cast<int16_t>(row.rbp.offset);
            rule.flags |= FrameRule::kRbpSaved;
            break;
        case SavedAs::kUnsupported:
            return rule;
    }
    rule.kind = FrameRuleKind::kStep;
    return rule;
}

}  // namespace

FrameRule compute_frame_rule(uintptr_t return_address) noexcept {
    FrameRule fallback;
    fallback.kind = FrameRuleKind::kFallback;
    if (return_address == 0) return fallback;

    // A return address may be one past the end of a noreturn call's function.
    uintptr_t pc = return_address - 1;
    dwarf_eh_bases bases{};
    const auto* fde =
        static_cast<const uint8_t*>(_Unwind_Find_FDE(reinterpret_cast<void*>(pc), &bases));
    if (fde == nullptr) return fallback;
    uint32_t length = load_u32(fde);
    if (length < 8 || length == 0xffffffff) return fallback;
    CfiCursor cur(fde + 4, fde + 4 + length);
    uint32_t cie_delta = cur.fixed<uint32_t>();
    CieInfo cie;
    if (!parse_cie(fde + 4 - cie_delta, cie)) return fallback;
    cur.skip_encoded(cie.fde_encoding);         // pc_begin: bases.func holds it decoded
    cur.skip_encoded(cie.fde_encoding & 0x0f);  // pc_range
    if (cie.has_augmentation_data) cur.skip(cur.uleb());
    if (cur.failed()) return fallback;

    CfaRow initial;
    if (!run_cfa_program(CfiCursor(cie.program, cie.program_end), cie,
                         std::numeric_limits<uint64_t>::max(), CfaRow{}, initial)) {
        return fallback;
    }
    auto function_start = reinterpret_cast<uintptr_t>(bases.func);
    if (pc < function_start) return fallback;
    CfaRow row = initial;
    uint64_t target = pc - function_start;
    if (!run_cfa_program(cur, cie, target, initial, row)) return fallback;
    return to_frame_rule(row);
}

}  // namespace allocscope
