//! Basic auth against bcrypt hashes. A bcrypt check costs tens of milliseconds of CPU by
//! design, so answers are remembered (a scraper's every request after its first costs a
//! lookup), checks run one at a time off the endpoint's thread, and refusals are remembered
//! apart, so a stream of wrong passwords neither delays the answers to the right one nor
//! pushes it out of memory.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex},
};

use base64::{engine::general_purpose::STANDARD, Engine as _};
use tokio::sync::Semaphore;

/// How many (user, password) pairs each memory keeps; full, it starts again.
const REMEMBERED: usize = 256;

pub struct BasicAuth {
    users: BTreeMap<String, String>,
    accepted: Mutex<HashSet<(String, String)>>,
    refused: Mutex<HashSet<(String, String)>>,
    checking: Semaphore,
}

impl BasicAuth {
    /// None when there are no users: nothing to check.
    pub fn new(users: BTreeMap<String, String>) -> Option<Arc<Self>> {
        (!users.is_empty()).then(|| {
            Arc::new(Self {
                users,
                accepted: Mutex::default(),
                refused: Mutex::default(),
                checking: Semaphore::new(1),
            })
        })
    }

    /// Whether an `Authorization` header's value names a user with their password.
    pub async fn allows(self: &Arc<Self>, header: Option<&[u8]>) -> bool {
        let Some(pair) = header.and_then(credentials) else {
            return false;
        };
        if let Some(known) = self.remembered(&pair) {
            return known;
        }
        let Ok(_one_at_a_time) = self.checking.acquire().await else {
            return false;
        };
        // Checked by the request before this one, maybe.
        if let Some(known) = self.remembered(&pair) {
            return known;
        }
        // An unknown user costs a check too, so timing does not tell which users exist.
        let (known_user, hash) = match self.users.get(&pair.0) {
            Some(h) => (true, h.clone()),
            None => (
                false,
                self.users.values().next().cloned().unwrap_or_default(),
            ),
        };
        let password = pair.1.clone();
        let matches =
            tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
                .await
                .unwrap_or(false);
        let ok = known_user && matches;
        let memory = if ok { &self.accepted } else { &self.refused };
        let mut m = memory.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= REMEMBERED {
            m.clear();
        }
        m.insert(pair);
        ok
    }

    fn remembered(&self, pair: &(String, String)) -> Option<bool> {
        let has = |m: &Mutex<HashSet<(String, String)>>| {
            m.lock().unwrap_or_else(|e| e.into_inner()).contains(pair)
        };
        if has(&self.accepted) {
            Some(true)
        } else if has(&self.refused) {
            Some(false)
        } else {
            None
        }
    }
}

/// The user and password of `Basic base64(user:password)`.
fn credentials(header: &[u8]) -> Option<(String, String)> {
    let header = std::str::from_utf8(header).ok()?;
    let (scheme, encoded) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = String::from_utf8(STANDARD.decode(encoded.trim()).ok()?).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.into(), password.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(user: &str, password: &str) -> Vec<u8> {
        format!("Basic {}", STANDARD.encode(format!("{user}:{password}"))).into_bytes()
    }

    #[tokio::test]
    async fn only_a_user_with_their_password_passes_and_answers_are_remembered() {
        let users = BTreeMap::from([
            ("a".to_string(), bcrypt::hash("right", 4).expect("hash")),
            ("b".to_string(), bcrypt::hash("other", 4).expect("hash")),
        ]);
        let auth = BasicAuth::new(users).expect("users");
        assert!(auth.allows(Some(&header("a", "right"))).await);
        assert!(!auth.allows(Some(&header("a", "other"))).await);
        assert!(
            !auth.allows(Some(&header("c", "right"))).await,
            "no such user"
        );
        assert!(!auth.allows(Some(b"Bearer x")).await);
        assert!(!auth.allows(Some(b"Basic !!!")).await);
        assert!(!auth.allows(None).await);
        assert!(auth.remembered(&("a".into(), "right".into())) == Some(true));
        assert!(auth.remembered(&("a".into(), "other".into())) == Some(false));
        // Wrong passwords by the hundred never push out the right one.
        for i in 0..2 * REMEMBERED {
            assert!(!auth.allows(Some(&header("a", &i.to_string()))).await);
        }
        assert!(auth.remembered(&("a".into(), "right".into())) == Some(true));
        assert!(BasicAuth::new(BTreeMap::new()).is_none());
    }
}
