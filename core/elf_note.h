// The GNU build id of an ELF object, found in a block of its notes (a
// PT_NOTE segment as loaded in memory, or a PT_NOTE / SHT_NOTE range of the
// file). The interposer records it per module; symbolization checks a
// module file against it.
#pragma once

#include <elf.h>
#include <link.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace allocscope {

// The descriptor of the NT_GNU_BUILD_ID note among the `size` bytes of notes
// at `notes` (entries padded to `align`: 4, or 8 for some 64-bit objects);
// "" when there is none or the block is malformed.
inline std::string gnu_build_id(const unsigned char* notes, size_t size, size_t align = 4) {
    const size_t pad = align == 8 ? 7 : 3;
    size_t p = 0;
    while (size - p >= sizeof(Elf64_Nhdr)) {
        Elf64_Nhdr note;
        std::memcpy(&note, notes + p, sizeof note);
        const size_t name = p + sizeof note;
        const size_t desc = name + ((size_t(note.n_namesz) + pad) & ~pad);
        const size_t next = desc + ((size_t(note.n_descsz) + pad) & ~pad);
        if (desc > size || note.n_descsz > size - desc) break;
        if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 &&
            std::memcmp(notes + name, "GNU", 4) == 0) {
            return std::string(reinterpret_cast<const char*>(notes + desc), note.n_descsz);
        }
        if (next <= p || next > size) break;
        p = next;
    }
    return {};
}

// The build id of a module loaded in this process (dl_iterate_phdr's view
// of it), from its PT_NOTE segments in memory; "" when it has none.
inline std::string loaded_build_id(const dl_phdr_info* info) {
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_NOTE) continue;
        const auto* notes = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
        std::string id = gnu_build_id(notes, ph.p_memsz, ph.p_align);
        if (!id.empty()) return id;
    }
    return {};
}

}  // namespace allocscope
