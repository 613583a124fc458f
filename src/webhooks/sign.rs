//! Standard Webhooks signatures: `webhook-signature: v1,<base64 of HMAC-SHA256(key,
//! "<webhook-id>.<webhook-timestamp>.<body>")>`, the key being the base64 after `whsec_`.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const PREFIX: &str = "whsec_";
/// Bytes of a new secret's key (the spec asks for 24 to 64).
const KEY_BYTES: usize = 32;

/// A new secret, in the form every Standard Webhooks library reads.
pub fn new_secret() -> String {
    let mut key = [0u8; KEY_BYTES];
    getrandom::getrandom(&mut key).expect("the system's random source works");
    format!("{PREFIX}{}", base64::engine::general_purpose::STANDARD.encode(key))
}

/// The key a secret holds; `None` for one not in the `whsec_<base64>` form or too short.
pub fn key_of(secret: &str) -> Option<Vec<u8>> {
    let encoded = secret.strip_prefix(PREFIX)?;
    let key = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
    (key.len() >= 24 && key.len() <= 64).then_some(key)
}

/// The `webhook-signature` header's value.
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_specs_example_signs_the_same() {
        // The example in the Standard Webhooks specification.
        let key = key_of("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        let signed = signature(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(signed, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn secrets_are_whsec_and_enough_key() {
        let secret = new_secret();
        assert_eq!(key_of(&secret).map(|key| key.len()), Some(KEY_BYTES));
        assert_ne!(new_secret(), secret);
        assert_eq!(key_of("whsec_c2hvcnQ="), None, "too short");
        assert_eq!(key_of("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), None);
    }
}
