//! Integer fields that also take a JSON number written with a zero fraction
//! (`2.0`): JSON Schema counts it as an integer, and generated clients (and
//! JavaScript's `JSON.stringify` of computed values) send it. A fraction
//! other than zero, or a value out of range, is still refused.

use serde::de::{self, Deserializer, Visitor};
use std::fmt;

struct Integral;

impl Visitor<'_> for Integral {
    type Value = i128;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an integer")
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<i128, E> {
        Ok(value.into())
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<i128, E> {
        Ok(value.into())
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<i128, E> {
        if value.is_finite() && value.fract() == 0.0 && value.abs() < 9.2e18 {
            Ok(value as i128)
        } else {
            Err(E::invalid_type(de::Unexpected::Float(value), &self))
        }
    }
}

fn integral<'de, D: Deserializer<'de>, T: TryFrom<i128>>(deserializer: D) -> Result<T, D::Error> {
    let value = deserializer.deserialize_any(Integral)?;
    T::try_from(value).map_err(|_| {
        de::Error::invalid_value(de::Unexpected::Other("an integer out of range"), &Integral)
    })
}

/// For an `i64` field.
pub fn i64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    integral(deserializer)
}

/// For an `Option<u64>` field (`null` is `None`).
pub fn option_u64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    struct OptionIntegral;
    impl<'de> Visitor<'de> for OptionIntegral {
        type Value = Option<u64>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an integer or null")
        }

        fn visit_none<E: de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
            integral(d).map(Some)
        }
    }
    deserializer.deserialize_option(OptionIntegral)
}

#[cfg(test)]
mod tests {
    #[derive(Debug, serde::Deserialize)]
    struct Sample {
        #[serde(deserialize_with = "super::i64")]
        count: i64,
        #[serde(default, deserialize_with = "super::option_u64")]
        ttl: Option<u64>,
    }

    fn parse(json: &str) -> Result<Sample, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn integers_and_zero_fractions_are_taken() {
        let sample = parse(r#"{"count": 2.0, "ttl": 137.0}"#).unwrap();
        assert_eq!((sample.count, sample.ttl), (2, Some(137)));
        let sample = parse(r#"{"count": -3, "ttl": null}"#).unwrap();
        assert_eq!((sample.count, sample.ttl), (-3, None));
        assert_eq!(parse(r#"{"count": 1}"#).unwrap().ttl, None);
    }

    #[test]
    fn fractions_strings_and_out_of_range_are_refused() {
        for bad in [
            r#"{"count": 2.5}"#,
            r#"{"count": "2"}"#,
            r#"{"count": 1e300}"#,
            r#"{"count": 1, "ttl": -1}"#,
            r#"{"count": 1, "ttl": 1.5}"#,
            r#"{"count": 1, "ttl": true}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
