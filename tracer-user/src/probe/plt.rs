//! Reading a library's procedure linkage table (PLT): which of its entries jumps through which
//! slot of the global offset table (GOT), on each architecture whose libraries are hooked. The
//! slot names the imported function (its relocation says which); the entry is where a call to
//! that function leaves the library.

use std::collections::BTreeMap;

use object::{elf, Architecture};

/// The PLT layouts read: x86-64's and aarch64's (Grace hosts).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Plt {
    X86_64,
    Aarch64,
}

impl Plt {
    /// The layout of a library built for `arch`, if it is one read here.
    pub fn of(arch: Architecture) -> Option<Self> {
        match arch {
            Architecture::X86_64 => Some(Self::X86_64),
            Architecture::Aarch64 => Some(Self::Aarch64),
            _ => None,
        }
    }

    /// The relocation types of the GOT slots its PLT entries jump through. x86-64's .plt.got
    /// jumps through GLOB_DAT slots (functions whose address is also taken); aarch64's linkers
    /// give such a function a JUMP_SLOT of its own for its PLT entry, so only those are read.
    pub fn slot_relocations(self) -> &'static [u32] {
        match self {
            Self::X86_64 => &[elf::R_X86_64_JUMP_SLOT, elf::R_X86_64_GLOB_DAT],
            Self::Aarch64 => &[elf::R_AARCH64_JUMP_SLOT],
        }
    }

    /// The sections that hold its PLT entries, the first of them preferred for a function
    /// that has entries in two (x86-64 with IBT: .plt.sec is what the code calls).
    pub fn sections(self) -> &'static [&'static str] {
        match self {
            Self::X86_64 => &[".plt.sec", ".plt", ".plt.got"],
            Self::Aarch64 => &[".plt"],
        }
    }

    /// The entries of PLT section `section` (its bytes `data`, loaded at `address`) that jump
    /// through one of `slots`: each one's offset in the section and its function.
    pub fn jumps(
        self,
        section: &str,
        data: &[u8],
        address: u64,
        slots: &BTreeMap<u64, String>,
    ) -> Vec<(u64, String)> {
        match self {
            Self::X86_64 => {
                let entry = if section == ".plt.got" { 8 } else { 16 };
                x86_64_jumps(data, address, entry, slots)
            }
            Self::Aarch64 => aarch64_jumps(data, address, slots),
        }
    }
}

/// x86-64: `entry`-byte entries, each with a `jmp *disp32(%rip)` (ff 25) somewhere in it, after
/// an `endbr64` and a `bnd` prefix where the library was built for IBT or MPX.
fn x86_64_jumps(
    data: &[u8],
    address: u64,
    entry: usize,
    slots: &BTreeMap<u64, String>,
) -> Vec<(u64, String)> {
    let mut found = Vec::new();
    for (i, slot) in data.chunks_exact(entry).enumerate() {
        for at in 0..entry.saturating_sub(5) {
            if slot[at] != 0xff || slot[at + 1] != 0x25 {
                continue;
            }
            let disp = i32::from_le_bytes([slot[at + 2], slot[at + 3], slot[at + 4], slot[at + 5]]);
            let next = address + (i * entry + at + 6) as u64;
            let target = next.wrapping_add_signed(disp as i64);
            if let Some(name) = slots.get(&target) {
                found.push(((i * entry) as u64, name.clone()));
            }
            break;
        }
    }
    found
}

/// aarch64: an entry loads its slot's address as `adrp x16, page; ldr x17, [x16, #offset]`
/// and branches to it (`br x17`), with a `bti c` landing pad before the `adrp` where the linker
/// put one, and an `autia1716` before the branch where it signs the slot (PAC). Entries are 16
/// or 24 bytes by those choices, so the instructions are read rather than slots counted.
fn aarch64_jumps(data: &[u8], address: u64, slots: &BTreeMap<u64, String>) -> Vec<(u64, String)> {
    let words: Vec<u32> = data
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let mut found = Vec::new();
    for (i, pair) in words.windows(2).enumerate() {
        let pc = address + 4 * i as u64;
        let (Some(page), Some(offset)) = (adrp_x16(pair[0], pc), ldr_x17_from_x16(pair[1])) else {
            continue;
        };
        if let Some(name) = slots.get(&page.wrapping_add(offset)) {
            let start = if i > 0 && is_bti(words[i - 1]) {
                i - 1
            } else {
                i
            };
            found.push((4 * start as u64, name.clone()));
        }
    }
    found
}

/// The page that `adrp x16, page` at `pc` loads, if `insn` is that instruction.
fn adrp_x16(insn: u32, pc: u64) -> Option<u64> {
    if insn & 0x9f00_001f != 0x9000_0010 {
        return None;
    }
    let low = u64::from((insn >> 29) & 0x3);
    let high = u64::from((insn >> 5) & 0x7_ffff);
    // A signed 21-bit count of 4 KiB pages.
    let pages = (((high << 2 | low) << 43) as i64) >> 43;
    Some((pc & !0xfff).wrapping_add_signed(pages << 12))
}

/// The offset that `ldr x17, [x16, #offset]` (64-bit load, unsigned scaled offset) adds to x16,
/// if `insn` is that instruction.
fn ldr_x17_from_x16(insn: u32) -> Option<u64> {
    (insn & 0xffc0_03ff == 0xf940_0211).then(|| u64::from((insn >> 10) & 0xfff) * 8)
}

/// Whether `insn` is a BTI landing pad (any of its c, j, jc forms).
fn is_bti(insn: u32) -> bool {
    insn & 0xffff_ff3f == 0xd503_241f
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entries `plt` finds in section bytes `data` at `address` whose slots are ioctl's
    /// and close's.
    fn ioctl_and_close(
        plt: Plt,
        section: &str,
        data: &[u8],
        address: u64,
        [ioctl, close]: [u64; 2],
    ) -> Vec<(u64, String)> {
        let slots = BTreeMap::from([(ioctl, "ioctl".to_string()), (close, "close".into())]);
        plt.jumps(section, data, address, &slots)
    }

    #[test]
    fn an_x86_64_entry_is_found_by_the_slot_it_jumps_through() {
        // Two 16-byte entries at 0x1000: `jmp *0x2ffa(%rip)` -> 0x4000 (ioctl), and an
        // IBT entry `endbr64; bnd jmp *disp(%rip)` -> 0x4008 (close).
        let mut data = vec![0u8; 32];
        data[0..6].copy_from_slice(&[0xff, 0x25, 0xfa, 0x2f, 0x00, 0x00]);
        let disp = (0x4008i64 - (0x1000 + 16 + 4 + 1 + 6)) as i32;
        data[16..20].copy_from_slice(&[0xf3, 0x0f, 0x1e, 0xfa]);
        data[20] = 0xf2;
        data[21..23].copy_from_slice(&[0xff, 0x25]);
        data[23..27].copy_from_slice(&disp.to_le_bytes());
        let found = ioctl_and_close(Plt::X86_64, ".plt.sec", &data, 0x1000, [0x4000, 0x4008]);
        assert_eq!(found, [(0, "ioctl".into()), (16, "close".into())]);
    }

    #[test]
    fn an_aarch64_entry_starts_at_its_landing_pad_where_it_has_one() {
        // At 0x10ff8: `bti c; adrp x16, 0x21000; ldr x17, [x16, #40]; add; br x17` (slot
        // 0x21028), then an entry without a pad, from the next page, through slot 0x20028.
        let words: [u32; 9] = [
            0xd503_245f,
            0xb000_0090, // adrp x16, 17 pages on from 0x10000
            0xf940_1611,
            0x9100_a210,
            0xd61f_0220,
            0xf000_0070, // adrp x16, 15 pages on from 0x11000
            0xf940_1611,
            0x9100_a210,
            0xd61f_0220,
        ];
        let data: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let found = ioctl_and_close(Plt::Aarch64, ".plt", &data, 0x10ff8, [0x21028, 0x20028]);
        assert_eq!(found, [(0, "ioctl".into()), (20, "close".into())]);
    }

    #[test]
    fn adrp_reaches_pages_behind_it() {
        // adrp x16, -1 page: immlo 3, immhi all ones.
        assert_eq!(adrp_x16(0xf0ff_fff0, 0x5000), Some(0x4000));
        assert_eq!(adrp_x16(0xf0ff_fff1, 0x5000), None, "x17, not x16");
    }

    #[test]
    fn other_architectures_are_not_read() {
        assert_eq!(Plt::of(Architecture::Riscv64), None);
        assert_eq!(Plt::of(Architecture::Aarch64), Some(Plt::Aarch64));
    }
}
