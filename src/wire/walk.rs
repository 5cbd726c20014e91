//! A bounded walk over a Kafka message body, driven by its schema
//! (`wire::schema`), that can also re-emit the body with some values
//! replaced and some array elements dropped.
//!
//! Why not decode into structs: a decoder that trusts the wire reserves
//! memory from the counts it reads (a forged count of 2^31 aborts the
//! process), and a generated decoder only knows the versions it was generated
//! for. The walk reserves nothing from the wire: every count and length is
//! checked against the bytes that remain before it is used, values are
//! reported to a `Visitor` as they are read, and records are reported as a
//! span of the input, never copied. Re-emitting copies the input field by
//! field, so only the values a visitor replaces are encoded anew; sizes of
//! tagged fields and array counts around them are recomputed.
//!
//! Pure: bytes in, events and bytes out.

use std::ops::Range;

use super::cursor::{Cursor, CursorError};
use super::schema::{Field, Message, Type};
use super::write::put_uvarint;

/// Why a body could not be walked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalkError {
    #[error("{message} v{version} is not a version this proxy knows (knows {min} to {max})")]
    Version {
        message: String,
        version: i16,
        min: i16,
        max: i16,
    },
    #[error("{path}: needs {need} bytes at offset {at}, only {left} left")]
    Short {
        path: String,
        at: usize,
        need: u64,
        left: usize,
    },
    #[error("{path}: count {count} at offset {at} is more than the {left} bytes left")]
    Count {
        path: String,
        at: usize,
        count: u64,
        left: usize,
    },
    #[error("{path}: invalid length {len} at offset {at}")]
    Length { path: String, at: usize, len: i64 },
    #[error("{path}: null at offset {at}, but the field is not nullable in this version")]
    Null { path: String, at: usize },
    #[error("{path}: malformed varint at offset {at}")]
    Varint { path: String, at: usize },
    #[error("{path}: tagged field {tag} declares {size} bytes but its value takes {used}")]
    TaggedSize {
        path: String,
        tag: u32,
        size: usize,
        used: usize,
    },
    #[error("{count} bytes after the end of the {message} body")]
    Trailing { message: String, count: usize },
    #[error("{path}: replacement value does not fit the field")]
    Replacement { path: String },
}

/// A value as read from the wire. Strings are raw bytes (UTF-8 is checked
/// by whoever needs the text); bytes and records are a span of the input.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value<'a> {
    Bool(bool),
    Int(i64),
    Float(f64),
    Uuid([u8; 16]),
    Str(Option<&'a [u8]>),
    Bytes(Option<Range<usize>>),
}

/// What to do with a value when re-emitting.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Edit {
    Keep,
    Int(i64),
    Str(String),
}

/// Receives what the walk reads. Every method has a default that ignores it.
pub(crate) trait Visitor {
    /// A value of `field` was read (for arrays of primitives: one element).
    fn value(&mut self, _field: &Field, _value: Value<'_>) -> Edit {
        Edit::Keep
    }
    /// A struct of `field` starts (an array element or a nested struct).
    fn enter(&mut self, _field: &Field) {}
    /// That struct ends. `false` drops it when it is an array element and
    /// the body is being re-emitted.
    fn leave(&mut self, _field: &Field) -> bool {
        true
    }
}

/// A visitor that looks at nothing: the walk only validates.
pub(crate) struct Validate;
impl Visitor for Validate {}

/// Check that `input[start..]` is exactly one `msg` body at `version`.
pub fn validate(msg: &Message, version: i16, input: &[u8], start: usize) -> Result<(), WalkError> {
    walk(msg, version, input, start, &mut Validate)
}

/// Walk `input[start..]`, which must be exactly one `msg` body at `version`.
/// Reported spans are offsets into `input`.
pub(crate) fn walk<V: Visitor>(
    msg: &Message,
    version: i16,
    input: &[u8],
    start: usize,
    visitor: &mut V,
) -> Result<(), WalkError> {
    let mut w = Walker::new(msg, version, input, start, visitor, false)?;
    w.body(msg)?;
    Ok(())
}

/// Walk like `walk` and return `input[..start]` followed by the body
/// re-emitted with the visitor's edits and drops.
pub(crate) fn rewrite<V: Visitor>(
    msg: &Message,
    version: i16,
    input: &[u8],
    start: usize,
    visitor: &mut V,
) -> Result<Vec<u8>, WalkError> {
    let mut w = Walker::new(msg, version, input, start, visitor, true)?;
    w.out
        .extend_from_slice(input.get(..start).unwrap_or_default());
    w.body(msg)?;
    Ok(w.out)
}

struct Walker<'a, 'v, V> {
    input: &'a [u8],
    /// Over `input`, or over the prefix of it that ends with the tagged
    /// field being read; positions are offsets into `input` either way.
    cur: Cursor<'a>,
    version: i16,
    flexible: bool,
    visitor: &'v mut V,
    emit: bool,
    out: Vec<u8>,
}

impl<'a, 'v, V: Visitor> Walker<'a, 'v, V> {
    fn new(
        msg: &Message,
        version: i16,
        input: &'a [u8],
        start: usize,
        visitor: &'v mut V,
        emit: bool,
    ) -> Result<Self, WalkError> {
        if !msg.valid.contains(version) {
            return Err(WalkError::Version {
                message: msg.name.clone(),
                version,
                min: msg.valid.min,
                max: msg.valid.max,
            });
        }
        Ok(Walker {
            input,
            cur: Cursor::at(input, start),
            version,
            flexible: msg.flexible.contains(version),
            visitor,
            emit,
            out: Vec::new(),
        })
    }

    fn body(&mut self, msg: &Message) -> Result<(), WalkError> {
        self.fields(&msg.fields)?;
        if self.pos() != self.input.len() {
            return Err(WalkError::Trailing {
                message: msg.name.clone(),
                count: self.input.len() - self.pos(),
            });
        }
        Ok(())
    }

    #[inline]
    fn pos(&self) -> usize {
        self.cur.position()
    }

    /// Take `n` bytes, returning where they are.
    #[inline]
    fn take(&mut self, field: &Field, n: u64) -> Result<Range<usize>, WalkError> {
        let at = self.pos();
        match usize::try_from(n).map(|len| self.cur.skip(len)) {
            Ok(Ok(())) => Ok(at..self.pos()),
            _ => Err(WalkError::Short {
                path: field.path.clone(),
                at,
                need: n,
                left: self.cur.remaining(),
            }),
        }
    }

    #[inline]
    fn fixed<const N: usize>(&mut self, field: &Field) -> Result<[u8; N], WalkError> {
        let at = self.pos();
        self.cur.array().map_err(|e| read_error(&field.path, at, e))
    }

    #[inline]
    fn uvarint(&mut self, field: &Field) -> Result<u32, WalkError> {
        let at = self.pos();
        self.cur
            .uvarint()
            .map_err(|e| read_error(&field.path, at, e))
    }

    /// Copy what was read since `from` to the output unchanged.
    fn copy(&mut self, from: usize) {
        if self.emit {
            self.out.extend_from_slice(&self.input[from..self.pos()]);
        }
    }

    fn fields(&mut self, fields: &[Field]) -> Result<(), WalkError> {
        for f in fields {
            if f.regular_at(self.version) {
                self.field(f)?;
            }
        }
        if self.flexible {
            self.tagged(fields)?;
        }
        Ok(())
    }

    fn field(&mut self, f: &Field) -> Result<(), WalkError> {
        let nullable = f.nullable.contains(self.version);
        self.value(f, &f.ty, nullable)
    }

    fn tagged(&mut self, fields: &[Field]) -> Result<(), WalkError> {
        let none = tagged_header();
        let start = self.pos();
        let count = self.uvarint(none)?;
        self.check_count(none, start, u64::from(count))?;
        self.copy(start);
        for _ in 0..count {
            let head = self.pos();
            let tag = self.uvarint(none)?;
            let tag_end = self.pos();
            let size = self.uvarint(none)?;
            let size_bytes = tag_end..self.pos();
            let known = fields
                .iter()
                .find(|f| f.tagged_at(self.version) && f.tag.map(|t| t.0) == Some(tag));
            let Some(f) = known else {
                // Unknown to this schema: kept byte for byte.
                self.take(none, u64::from(size))?;
                self.copy(head);
                continue;
            };
            let data = self.take(f, u64::from(size))?;
            // Read the value inside its declared size only.
            let saved = self.cur;
            self.cur = Cursor::at(&self.input[..data.end], data.start);
            // The tag and, while the value keeps its length, its size are
            // copied as sent: a varint need not be minimal, and a walk that
            // changes nothing re-emits the input byte for byte.
            if self.emit {
                self.out.extend_from_slice(&self.input[head..tag_end]);
            }
            let out_data = self.out.len();
            let r = self.field(f);
            let used = self.pos() - data.start;
            self.cur = saved;
            r?;
            if used != data.len() {
                return Err(WalkError::TaggedSize {
                    path: f.path.clone(),
                    tag,
                    size: data.len(),
                    used,
                });
            }
            if self.emit {
                let len = self.out.len() - out_data;
                let mut size = Vec::with_capacity(5);
                if len == data.len() {
                    size.extend_from_slice(&self.input[size_bytes]);
                } else {
                    put_uvarint(&mut size, u64::from(u32::try_from(len).unwrap_or(u32::MAX)));
                }
                self.out.splice(out_data..out_data, size);
            }
        }
        Ok(())
    }

    fn check_count(&self, field: &Field, at: usize, count: u64) -> Result<(), WalkError> {
        // Every element takes at least one byte in practice; Kafka's own
        // readers apply the same bound before allocating.
        let left = self.cur.remaining();
        if count > left as u64 {
            return Err(WalkError::Count {
                path: field.path.clone(),
                at,
                count,
                left,
            });
        }
        Ok(())
    }

    /// Read a length: `None` for null.
    fn length(&mut self, f: &Field, wide: bool) -> Result<Option<u64>, WalkError> {
        let at = self.pos();
        let len: i64 = if self.flexible {
            i64::from(self.uvarint(f)?) - 1
        } else if wide {
            i64::from(i32::from_be_bytes(self.fixed(f)?))
        } else {
            i64::from(i16::from_be_bytes(self.fixed(f)?))
        };
        match len {
            -1 => Ok(None),
            n if n >= 0 => Ok(Some(n as u64)),
            n => Err(WalkError::Length {
                path: f.path.clone(),
                at,
                len: n,
            }),
        }
    }

    fn value(&mut self, f: &Field, ty: &Type, nullable: bool) -> Result<(), WalkError> {
        let start = self.pos();
        let null = |w: &Self| WalkError::Null {
            path: f.path.clone(),
            at: w.pos(),
        };
        let scalar = match ty {
            Type::Bool => Some((Value::Bool(self.fixed::<1>(f)?[0] != 0), 1)),
            Type::Int8 => Some((Value::Int(i64::from(self.fixed::<1>(f)?[0] as i8)), 1)),
            Type::Int16 => Some((Value::Int(i64::from(i16::from_be_bytes(self.fixed(f)?))), 2)),
            Type::Uint16 => Some((Value::Int(i64::from(u16::from_be_bytes(self.fixed(f)?))), 2)),
            Type::Int32 => Some((Value::Int(i64::from(i32::from_be_bytes(self.fixed(f)?))), 4)),
            Type::Uint32 => Some((Value::Int(i64::from(u32::from_be_bytes(self.fixed(f)?))), 4)),
            Type::Int64 => Some((Value::Int(i64::from_be_bytes(self.fixed(f)?)), 8)),
            Type::Float64 => Some((Value::Float(f64::from_be_bytes(self.fixed(f)?)), 8)),
            Type::Uuid => Some((Value::Uuid(self.fixed(f)?), 16)),
            _ => None,
        };
        if let Some((value, width)) = scalar {
            let edit = self.visitor.value(f, value);
            return self.emit_int(f, start, width, ty, edit);
        }
        match ty {
            Type::String => {
                let len = self.length(f, false)?;
                let bytes = match len {
                    None if !nullable => return Err(null(self)),
                    None => None,
                    Some(n) if n > i16::MAX as u64 => {
                        return Err(WalkError::Length {
                            path: f.path.clone(),
                            at: start,
                            len: n as i64,
                        })
                    }
                    Some(n) => Some(self.take(f, n)?),
                };
                let input = self.input;
                let edit = self.visitor.value(f, Value::Str(bytes.map(|r| &input[r])));
                match edit {
                    Edit::Str(s) if self.emit => self.push_string(f, &s),
                    _ => {
                        self.copy(start);
                        Ok(())
                    }
                }
            }
            Type::Bytes | Type::Records => {
                let len = self.length(f, true)?;
                let span = match len {
                    None if !nullable => return Err(null(self)),
                    None => None,
                    Some(n) => Some(self.take(f, n)?),
                };
                self.visitor.value(f, Value::Bytes(span));
                self.copy(start);
                Ok(())
            }
            Type::Array(inner) => self.array(f, inner, nullable),
            Type::Struct(fields) => {
                if nullable {
                    let marker = self.fixed::<1>(f)?[0] as i8;
                    self.copy(start);
                    if marker < 0 {
                        return Ok(());
                    }
                }
                self.visitor.enter(f);
                self.fields(fields)?;
                self.visitor.leave(f);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn array(&mut self, f: &Field, inner: &Type, nullable: bool) -> Result<(), WalkError> {
        let start = self.pos();
        let count = match self.length(f, true)? {
            None if !nullable => {
                return Err(WalkError::Null {
                    path: f.path.clone(),
                    at: start,
                })
            }
            None => {
                self.copy(start);
                return Ok(());
            }
            Some(n) => n,
        };
        let count_len = self.pos() - start;
        self.check_count(f, start, count)?;
        let out_count = self.out.len();
        self.copy(start);
        let mut kept = count;
        for _ in 0..count {
            match inner {
                Type::Struct(fields) => {
                    let out_element = self.out.len();
                    self.visitor.enter(f);
                    self.fields(fields)?;
                    if !self.visitor.leave(f) && self.emit {
                        self.out.truncate(out_element);
                        kept -= 1;
                    }
                }
                other => self.value(f, other, false)?,
            }
        }
        if self.emit && kept != count {
            let mut encoded = Vec::with_capacity(5);
            if self.flexible {
                put_uvarint(
                    &mut encoded,
                    u64::from(u32::try_from(kept + 1).unwrap_or(u32::MAX)),
                );
            } else {
                encoded.extend_from_slice(&(kept as i32).to_be_bytes());
            }
            self.out.splice(out_count..out_count + count_len, encoded);
        }
        Ok(())
    }

    fn emit_int(
        &mut self,
        f: &Field,
        start: usize,
        width: usize,
        ty: &Type,
        edit: Edit,
    ) -> Result<(), WalkError> {
        if !self.emit {
            return Ok(());
        }
        let Edit::Int(v) = edit else {
            self.copy(start);
            return Ok(());
        };
        let bad = || WalkError::Replacement {
            path: f.path.clone(),
        };
        match (ty, width) {
            (Type::Int8, _) => self.out.push(i8::try_from(v).map_err(|_| bad())? as u8),
            (Type::Int16, _) => self
                .out
                .extend_from_slice(&i16::try_from(v).map_err(|_| bad())?.to_be_bytes()),
            (Type::Uint16, _) => self
                .out
                .extend_from_slice(&u16::try_from(v).map_err(|_| bad())?.to_be_bytes()),
            (Type::Int32, _) => self
                .out
                .extend_from_slice(&i32::try_from(v).map_err(|_| bad())?.to_be_bytes()),
            (Type::Uint32, _) => self
                .out
                .extend_from_slice(&u32::try_from(v).map_err(|_| bad())?.to_be_bytes()),
            (Type::Int64, _) => self.out.extend_from_slice(&v.to_be_bytes()),
            _ => return Err(bad()),
        }
        Ok(())
    }

    fn push_string(&mut self, f: &Field, s: &str) -> Result<(), WalkError> {
        let len = s.len();
        if len > i16::MAX as usize {
            return Err(WalkError::Replacement {
                path: f.path.clone(),
            });
        }
        if self.flexible {
            put_uvarint(&mut self.out, u64::from(len as u32 + 1));
        } else {
            self.out.extend_from_slice(&(len as i16).to_be_bytes());
        }
        self.out.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// The walks' error for a read of `path` at offset `at` that failed.
#[cold]
pub(super) fn read_error(path: &str, at: usize, e: CursorError) -> WalkError {
    match e {
        CursorError::Short { need, left } => WalkError::Short {
            path: path.into(),
            at,
            need: need as u64,
            left,
        },
        CursorError::Varint => WalkError::Varint {
            path: path.into(),
            at,
        },
    }
}

/// Stands for the framing of a tagged-field section in errors.
fn tagged_header() -> &'static Field {
    static FIELD: std::sync::OnceLock<Field> = std::sync::OnceLock::new();
    FIELD.get_or_init(|| Field::synthetic("(tagged fields)"))
}

#[cfg(test)]
mod tests;
