//! References to a dead process's GPU files that no known holder accounts for: counted at its
//! death, recounted as holders die, and searched for among the processes holding GPU files.

use crate::analysis::{
    holders::{FileId, HeldFile, Holder, How},
    references,
};

use super::Correlator;

impl Correlator {
    /// Process `pid` died holding `held` (its exit walk): the dead cases with references to
    /// those files that nobody known accounted for count it among their holders (it got them
    /// unseen: by fork or a socket before linger began, or by a receive no hook sees). Its
    /// walk then recounts their references, and its release is theirs to wait for.
    pub(super) fn unseen_holder_died(
        &mut self,
        (pid, ppid, comm): (u32, u32, &str),
        held: &[HeldFile],
        t_ns: u64,
    ) {
        let ids: Vec<u64> = self
            .cases
            .iter()
            .filter(|(_, c)| {
                c.inc.target.pid != pid
                    && c.unaccounted.any()
                    && !c.holder_gone.contains_key(&pid)
                    && held
                        .iter()
                        .any(|h| h.refcount > 0 && c.unaccounted.counts(h.file))
            })
            .map(|(id, _)| *id)
            .collect();
        let fds: Vec<i32> = held.iter().map(|h| h.fd).filter(|fd| *fd >= 0).collect();
        for id in ids {
            let holder = Holder {
                pid,
                comm: comm.to_string(),
                ppid,
                fds: fds.clone(),
                how: How::Seen { t_ns },
                t_released_ns: None,
                t_dead_ns: None,
                t_killed_ns: None,
            };
            // Killed with the victim, where the kill reached it before it let go.
            self.co_victims_at_death(id, std::slice::from_ref(&holder));
            if let Some(c) = self.cases.get_mut(&id) {
                c.holder_gone.insert(pid, None);
                c.fd_holders.push(holder);
            }
            self.agenda.touch(id);
            self.cases.holds_for(pid, id);
        }
    }

    /// A searched process's walk is in: it joins the holders of the dead cases whose files it
    /// holds and whose references were not all accounted for.
    pub(super) fn searched(&mut self, pid: u32) {
        let ids: Vec<u64> = self
            .cases
            .iter()
            // A walk lists one descriptor per record: a holder already found grows with them.
            .filter(|(_, c)| {
                c.unaccounted.any()
                    || c.fd_holders
                        .iter()
                        .any(|h| h.pid == pid && h.found_by_walk())
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(c) = self.cases.get(&id) else {
                continue;
            };
            let target = c.inc.target.pid;
            let Some(found) = self
                .holders
                .holders_of(&c.files, target)
                .into_iter()
                .find(|h| h.pid == pid)
            else {
                continue;
            };
            let held = c
                .inc
                .gpu
                .as_ref()
                .map(|g| g.files.clone())
                .unwrap_or_default();
            let left = references::unaccounted(&held, &self.holders, target);
            if let Some(c) = self.cases.get_mut(&id) {
                c.unaccounted.at_most(&left);
                c.holder_gone.entry(pid).or_insert(None);
                self.agenda.touch(id);
                match c.fd_holders.iter_mut().find(|h| h.pid == pid) {
                    Some(known) => known.fds = found.fds,
                    None => c.fd_holders.push(found),
                }
                self.cases.holds_for(pid, id);
            }
        }
    }

    /// A holder of dead processes' files died (`pid`, its exit walk `walk`, made at
    /// `walked_ns`): the references
    /// to those files are counted afresh, without its threads' polls and calls, which ended
    /// before its last thread walked.
    pub(super) fn holder_walked(
        &mut self,
        cases: &[u64],
        walk: &[HeldFile],
        (pid, walked_ns): (u32, u64),
    ) {
        for id in cases {
            let Some(c) = self.cases.get(id) else {
                continue;
            };
            let theirs: Vec<HeldFile> = walk
                .iter()
                .filter(|h| h.refcount > 0 && c.files.contains(&h.file))
                .cloned()
                .collect();
            if theirs.is_empty() {
                continue;
            }
            let mut fresh = references::unaccounted(&theirs, &self.holders, pid);
            if c.kernel_release.is_none_or(|(t, _)| t >= walked_ns) {
                // The dead process had not closed its own descriptors yet at that walk.
                if let Some(gpu) = &c.inc.gpu {
                    fresh.found_in(&gpu.files);
                }
            }
            let counted: Vec<FileId> = theirs.iter().map(|h| h.file).collect();
            if let Some(c) = self.cases.get_mut(id) {
                c.unaccounted.recount(&counted, fresh);
            }
            self.keep_unseen(*id, walked_ns);
        }
    }

    /// Of a dead case's references nobody known accounts for, keeps those on files no holder
    /// linger knows may be holding: a live one (a poll or a call under way in one of its
    /// threads holds a reference of its own) or another dead process whose exit has not
    /// closed them yet, when the walk that counted them (at `walked`: the death's own, or a
    /// holder's that recounted them) ran. Only those are searched for; the others are counted
    /// again when their holder dies.
    pub(super) fn keep_unseen(&mut self, id: u64, walked: u64) {
        let Some(c) = self.cases.get(&id) else {
            return;
        };
        if !c.unaccounted.any() {
            return;
        }
        // Dying when the walk (at `walked`) counted the references: a release that came
        // between that walk and its group-dead record (from another CPU) had not happened yet.
        let dying: Vec<FileId> = self
            .cases
            .iter()
            .filter(|(other, o)| {
                **other != id
                    && o.inc.t_group_dead_ns.is_some()
                    && o.kernel_release.is_none_or(|(t, _)| t >= walked)
            })
            .flat_map(|(_, o)| o.files.iter().copied())
            .collect();
        let holders = &self.holders;
        if let Some(c) = self.cases.get_mut(&id) {
            c.unaccounted
                .retain(|f| !holders.holds_file(f) && !dying.contains(&f));
            self.search_wanted |= c.unaccounted.any();
        }
    }
}
