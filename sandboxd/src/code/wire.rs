//! Jupyter messages on ZeroMQ frames (messaging spec 5.x): routing
//! identities, the `<IDS|MSG>` delimiter, the HMAC-SHA256 signature in hex,
//! then header, parent header, metadata and content as JSON. Every frame
//! from the kernel is checked against the connection key (in constant
//! time) before anything reads its JSON: a process of the sandbox that
//! found a kernel's port cannot inject results into an execution.

use bytes::Bytes;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

const DELIMITER: &[u8] = b"<IDS|MSG>";

/// The connection key and what signs and checks with it.
#[derive(Clone)]
pub struct Signer {
    key: Vec<u8>,
}

/// One message, decoded.
#[derive(Debug, Clone)]
pub struct Message {
    pub msg_type: String,
    /// The `msg_id` of the request this answers (empty when none).
    pub parent_id: String,
    pub content: Value,
}

impl Signer {
    pub fn new(key: Vec<u8>) -> Self {
        Signer { key }
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes keys of any length.
        Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC accepts any key length")
    }

    /// The frames of a new request of `msg_type` carrying `content`, and
    /// its `msg_id` (to match the kernel's answers by their parent).
    pub fn request(&self, session: &str, msg_type: &str, content: Value) -> (Vec<Bytes>, String) {
        let msg_id = random_hex();
        let header = json!({
            "msg_id": msg_id,
            "session": session,
            "username": "sandhub",
            "date": httpdate_now(),
            "msg_type": msg_type,
            "version": "5.3",
        });
        let parts = [
            serde_json::to_vec(&header).unwrap_or_default(),
            b"{}".to_vec(),
            b"{}".to_vec(),
            serde_json::to_vec(&content).unwrap_or_default(),
        ];
        let mut mac = self.mac();
        for p in &parts {
            mac.update(p);
        }
        let signature = hex::encode(mac.finalize().into_bytes());
        let mut frames = vec![
            Bytes::from_static(DELIMITER),
            Bytes::from(signature.into_bytes()),
        ];
        frames.extend(parts.into_iter().map(Bytes::from));
        (frames, msg_id)
    }

    /// Decodes frames from the kernel; `Err` says why they were refused.
    pub fn decode(&self, frames: &[Bytes]) -> Result<Message, &'static str> {
        let at = frames
            .iter()
            .position(|f| f.as_ref() == DELIMITER)
            .ok_or("no <IDS|MSG> delimiter")?;
        let rest = &frames[at + 1..];
        if rest.len() < 5 {
            return Err("too few frames");
        }
        let signature = hex::decode(&rest[0]).map_err(|_| "signature is not hex")?;
        let mut mac = self.mac();
        for p in &rest[1..5] {
            mac.update(p);
        }
        // `verify_slice` compares in constant time.
        mac.verify_slice(&signature).map_err(|_| "bad signature")?;
        let header: Value = serde_json::from_slice(&rest[1]).map_err(|_| "header is not JSON")?;
        let parent: Value =
            serde_json::from_slice(&rest[2]).map_err(|_| "parent header is not JSON")?;
        let content: Value = serde_json::from_slice(&rest[4]).map_err(|_| "content is not JSON")?;
        let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Ok(Message {
            msg_type: text(&header, "msg_type"),
            parent_id: text(&parent, "msg_id"),
            content,
        })
    }
}

/// 128 random bits in hex: message ids, session ids, keys.
pub fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

fn httpdate_now() -> String {
    // The spec asks for ISO 8601; ipykernel only logs it.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{secs}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's side of `request`: identities in front, the rest as is.
    fn as_kernel(frames: Vec<Bytes>) -> Vec<Bytes> {
        let mut out = vec![Bytes::from_static(b"peer")];
        out.extend(frames);
        out
    }

    #[test]
    fn a_signed_message_round_trips() {
        let s = Signer::new(b"key".to_vec());
        let (frames, id) = s.request("sess", "execute_request", json!({"code": "1"}));
        let m = s.decode(&as_kernel(frames)).unwrap();
        assert_eq!(m.msg_type, "execute_request");
        assert_eq!(m.content["code"], "1");
        assert!(m.parent_id.is_empty() && id.len() == 32);
    }

    #[test]
    fn a_wrong_key_or_a_changed_frame_is_refused() {
        let (frames, _) = Signer::new(b"key".to_vec()).request("s", "x", json!({}));
        assert_eq!(
            Signer::new(b"other".to_vec()).decode(&frames).unwrap_err(),
            "bad signature"
        );
        let mut changed = frames.clone();
        changed[5] = Bytes::from_static(br#"{"evil":1}"#);
        assert_eq!(
            Signer::new(b"key".to_vec()).decode(&changed).unwrap_err(),
            "bad signature"
        );
        assert!(Signer::new(b"key".to_vec()).decode(&frames[..3]).is_err());
    }
}
