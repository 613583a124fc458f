//! BAE keys and ids: their formats, their randomness, and how they are stored.
//!
//! A key is a role prefix and 24 OS-random bytes as 48 lowercase hex digits (`bae_…` for a
//! client, `bae_ses_…` for a session, `bae_admin_…` for the admin). Its plaintext is shown once;
//! the store keeps `HMAC-SHA256(secret, key)` and looks a presented key up by that digest.
//!
//! Why a fast keyed hash and not a slow password hash (BAE uses Argon2id, ~50 ms per check):
//! a slow hash protects guessable secrets by making each guess expensive. These keys are 192
//! random bits, so no guess is ever cheap enough to matter: one HMAC per request is as safe, and
//! a session's every RPC call does not burn 50 ms of CPU. The HMAC secret lives in its own file
//! in the data dir (mode 0600), so a copy of the database alone cannot even confirm a key.

use std::io::Write;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Random bytes in a key.
const KEY_BYTES: usize = 24;
/// Random bytes in an id (`ses_`, `pro_`, `key_`, `evt_`, `sba_`).
const ID_BYTES: usize = 16;
/// Characters of a key kept in the clear, to tell keys apart in lists.
pub const PREFIX_CHARS: usize = 8;

/// The kinds of key, by the prefix their plaintext carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRole {
    Client,
    Session,
    Admin,
}

impl KeyRole {
    pub fn prefix(self) -> &'static str {
        match self {
            KeyRole::Client => "bae_",
            KeyRole::Session => "bae_ses_",
            KeyRole::Admin => "bae_admin_",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            KeyRole::Client => "client",
            KeyRole::Session => "session",
            KeyRole::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<KeyRole> {
        Some(match text {
            "client" => KeyRole::Client,
            "session" => KeyRole::Session,
            "admin" => KeyRole::Admin,
            _ => return None,
        })
    }
}

/// A freshly minted key: the plaintext (shown once) and what the store keeps of it.
pub struct MintedKey {
    pub plaintext: String,
    /// The first `PREFIX_CHARS` characters.
    pub prefix: String,
    pub digest: String,
}

impl std::fmt::Debug for MintedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MintedKey {{ prefix: {:?}, plaintext: <redacted> }}", self.prefix)
    }
}

#[derive(Debug)]
pub enum KeyringError {
    /// The secret file could not be read or written.
    Io(std::io::Error),
    /// The secret file exists but is not a secret this server wrote.
    Malformed,
}

impl std::fmt::Display for KeyringError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyringError::Io(error) => write!(f, "key secret file: {error}"),
            KeyringError::Malformed => write!(f, "key secret file is not 64 hex digits"),
        }
    }
}

impl std::error::Error for KeyringError {}

/// Mints keys and digests presented ones under the server's secret.
pub struct Keyring {
    secret: [u8; 32],
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyring { secret: <redacted> }")
    }
}

impl Keyring {
    /// The keyring whose secret is in `path`, creating the file (mode 0600) on first use.
    pub fn open(path: &Path) -> Result<Keyring, KeyringError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Keyring::from_hex(text.trim()).ok_or(KeyringError::Malformed),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let keyring = Keyring { secret: random_bytes::<32>() };
                write_private(path, &hex(&keyring.secret)).map_err(KeyringError::Io)?;
                Ok(keyring)
            }
            Err(error) => Err(KeyringError::Io(error)),
        }
    }

    /// The secret as hex, as the file keeps it: what a cluster's first node proposes for all.
    pub fn secret_hex(&self) -> String {
        hex(&self.secret)
    }

    /// The keyring of a secret kept as hex; `None` if it is not 32 bytes of hex.
    pub fn from_hex(text: &str) -> Option<Keyring> {
        if text.len() != 64 {
            return None;
        }
        let mut secret = [0u8; 32];
        for (i, byte) in secret.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Keyring { secret })
    }

    /// A keyring with a fixed secret, for tests.
    pub fn with_secret(secret: [u8; 32]) -> Keyring {
        Keyring { secret }
    }

    /// A new random key of `role`.
    pub fn mint(&self, role: KeyRole) -> MintedKey {
        let plaintext = format!("{}{}", role.prefix(), hex(&random_bytes::<KEY_BYTES>()));
        let prefix = plaintext.chars().take(PREFIX_CHARS).collect();
        let digest = self.digest(&plaintext);
        MintedKey { plaintext, prefix, digest }
    }

    /// What the store keeps of a key, and looks a presented one up by.
    pub fn digest(&self, key: &str) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret).expect("HMAC takes a key of any length");
        mac.update(key.as_bytes());
        hex(&mac.finalize().into_bytes())
    }
}

/// A new id: `prefix` and 16 OS-random bytes as 32 lowercase hex digits.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", hex(&random_bytes::<ID_BYTES>()))
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    // The OS generator failing is not something a server can work around.
    getrandom::getrandom(&mut bytes).expect("the operating system's random source failed");
    bytes
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0x0f)] as char);
    }
    out
}

/// Writes `text` and a newline to a new file only its owner can read (mode 0600), replacing
/// any file of that name.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    // An existing file keeps its mode through `open`; make it private either way.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    writeln!(file, "{text}")?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_ids_have_the_documented_shapes() {
        let keyring = Keyring::with_secret([7; 32]);
        for (role, prefix) in
            [(KeyRole::Client, "bae_"), (KeyRole::Session, "bae_ses_"), (KeyRole::Admin, "bae_admin_")]
        {
            let key = keyring.mint(role);
            let random = key.plaintext.strip_prefix(prefix).unwrap();
            assert_eq!(random.len(), 48);
            assert!(random.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            assert_eq!(key.prefix, key.plaintext[..8]);
            assert_eq!(key.digest, keyring.digest(&key.plaintext));
        }
        let id = new_id("ses_");
        assert_eq!(id.len(), 4 + 32);
        assert_ne!(new_id("ses_"), id);
    }

    #[test]
    fn the_digest_depends_on_the_secret() {
        let key = "bae_0123";
        assert_ne!(Keyring::with_secret([1; 32]).digest(key), Keyring::with_secret([2; 32]).digest(key));
        assert_eq!(Keyring::with_secret([1; 32]).digest(key).len(), 64);
    }

    #[test]
    fn the_secret_file_is_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let first = Keyring::open(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let again = Keyring::open(&path).unwrap();
        assert_eq!(first.digest("k"), again.digest("k"));
        std::fs::write(&path, "not hex").unwrap();
        assert!(matches!(Keyring::open(&path), Err(KeyringError::Malformed)));
    }
}
