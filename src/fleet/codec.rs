//! How values cross the wire to the shared tier.

use std::fmt;

/// Why a value could not be encoded or decoded.
///
/// ```
/// use herdcache::fleet::{Codec, CodecError, Utf8};
/// let err: CodecError = Codec::<String>::decode(&Utf8, &[0xff]).unwrap_err();
/// assert!(err.to_string().starts_with("codec error: "));
/// assert!(std::error::Error::source(&err).is_some()); // the codec's own error
/// ```
#[derive(Debug)]
pub struct CodecError(Box<dyn std::error::Error + Send + Sync>);

impl CodecError {
    /// Wraps the codec's own error.
    ///
    /// ```
    /// use herdcache::fleet::CodecError;
    /// let err = CodecError::new("unknown format version 3");
    /// assert_eq!(err.to_string(), "codec error: unknown format version 3");
    /// ```
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        CodecError(error.into())
    }
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "codec error: {}", self.0)
    }
}

impl std::error::Error for CodecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// Turns values into bytes for the shared tier and back. A value that fails to decode is a
/// miss (counted), never a panic or a load error.
///
/// ```
/// use herdcache::fleet::{Codec, CodecError};
///
/// /// Big-endian u64s.
/// struct U64Codec;
/// impl Codec<u64> for U64Codec {
///     fn encode(&self, v: &u64) -> Result<Vec<u8>, CodecError> {
///         Ok(v.to_be_bytes().to_vec())
///     }
///     fn decode(&self, bytes: &[u8]) -> Result<u64, CodecError> {
///         let b: [u8; 8] = bytes.try_into().map_err(CodecError::new)?;
///         Ok(u64::from_be_bytes(b))
///     }
/// }
/// assert_eq!(U64Codec.decode(&U64Codec.encode(&7).unwrap()).unwrap(), 7);
/// assert!(U64Codec.decode(b"short").is_err());
/// ```
pub trait Codec<V>: Send + Sync + 'static {
    /// The bytes stored for `value`.
    fn encode(&self, value: &V) -> Result<Vec<u8>, CodecError>;
    /// The value `bytes` stand for.
    fn decode(&self, bytes: &[u8]) -> Result<V, CodecError>;
}

/// `String` values as UTF-8 (also `Arc<str>`).
///
/// ```
/// use std::sync::Arc;
/// use herdcache::fleet::{Codec, Utf8};
/// let bytes = Utf8.encode(&"héllo".to_owned())?;
/// assert_eq!(bytes, "héllo".as_bytes());
/// let back: Arc<str> = Utf8.decode(&bytes)?;
/// assert_eq!(&*back, "héllo");
/// assert!(Codec::<String>::decode(&Utf8, &[0xff, 0xfe]).is_err()); // not UTF-8
/// # Ok::<(), herdcache::fleet::CodecError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Utf8;

impl Codec<String> for Utf8 {
    fn encode(&self, value: &String) -> Result<Vec<u8>, CodecError> {
        Ok(value.as_bytes().to_vec())
    }
    fn decode(&self, bytes: &[u8]) -> Result<String, CodecError> {
        String::from_utf8(bytes.to_vec()).map_err(CodecError::new)
    }
}

impl Codec<std::sync::Arc<str>> for Utf8 {
    fn encode(&self, value: &std::sync::Arc<str>) -> Result<Vec<u8>, CodecError> {
        Ok(value.as_bytes().to_vec())
    }
    fn decode(&self, bytes: &[u8]) -> Result<std::sync::Arc<str>, CodecError> {
        Ok(std::str::from_utf8(bytes).map_err(CodecError::new)?.into())
    }
}

/// `Vec<u8>` values as they are.
///
/// ```
/// use herdcache::fleet::{Codec, Raw};
/// let bytes = Raw.encode(&vec![0, 159, 255])?;
/// assert_eq!(bytes, [0, 159, 255]);
/// assert_eq!(Raw.decode(&bytes)?, [0, 159, 255]);
/// # Ok::<(), herdcache::fleet::CodecError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Raw;

impl Codec<Vec<u8>> for Raw {
    fn encode(&self, value: &Vec<u8>) -> Result<Vec<u8>, CodecError> {
        Ok(value.clone())
    }
    fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, CodecError> {
        Ok(bytes.to_vec())
    }
}

/// Any serde value as JSON (feature `serde`).
///
/// ```
/// use herdcache::fleet::{Codec, Json};
/// #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
/// struct User {
///     id: u64,
///     name: String,
/// }
/// let user = User { id: 7, name: "Ada".into() };
/// let bytes = Json.encode(&user)?;
/// assert_eq!(bytes, br#"{"id":7,"name":"Ada"}"#);
/// assert_eq!(Codec::<User>::decode(&Json, &bytes)?, user);
/// # Ok::<(), herdcache::fleet::CodecError>(())
/// ```
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(all(feature = "redis", feature = "serde"))))]
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

#[cfg(feature = "serde")]
impl<V: serde::Serialize + serde::de::DeserializeOwned> Codec<V> for Json {
    fn encode(&self, value: &V) -> Result<Vec<u8>, CodecError> {
        serde_json::to_vec(value).map_err(CodecError::new)
    }
    fn decode(&self, bytes: &[u8]) -> Result<V, CodecError> {
        serde_json::from_slice(bytes).map_err(CodecError::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_round_trips_and_rejects_invalid_bytes() {
        let s = "héllo".to_owned();
        assert_eq!(
            Codec::<String>::decode(&Utf8, &Utf8.encode(&s).unwrap()).unwrap(),
            s
        );
        assert!(Codec::<String>::decode(&Utf8, &[0xff, 0xfe]).is_err());
    }

    #[cfg(feature = "serde")]
    #[test]
    fn json_round_trips_and_rejects_garbage() {
        let v = vec![(1u32, "a".to_owned())];
        let bytes = Json.encode(&v).unwrap();
        assert_eq!(
            Codec::<Vec<(u32, String)>>::decode(&Json, &bytes).unwrap(),
            v
        );
        assert!(Codec::<Vec<(u32, String)>>::decode(&Json, b"{not json").is_err());
    }
}
