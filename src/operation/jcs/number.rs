//! Numbers as ECMAScript writes a double (RFC 8785 §3.2.2.3).

/// A finite double as ECMAScript's `Number.prototype.toString` writes it (RFC 8785 §3.2.2.3).
pub(crate) fn write_number(value: f64, out: &mut Vec<u8>) {
    if value == 0.0 {
        out.push(b'0'); // and -0 too
        return;
    }
    // Zero, the one double whose sign is not written, is behind.
    if value.is_sign_negative() {
        out.push(b'-');
    }
    let magnitude = value.abs();
    if let Some(integer) = small_integer(magnitude) {
        write_decimal(integer, out);
        return;
    }
    // Any other double as ECMAScript's `Number.prototype.toString` writes it: the shortest
    // digits that read back as the same double, plain up to 21 digits, else `d.ddde±x`
    // (ryu-js, ECMAScript's algorithm on the stack).
    let mut buffer = ryu_js::Buffer::new();
    out.extend_from_slice(buffer.format_finite(magnitude).as_bytes());
}

/// `magnitude` as an integer, if it is one below 2^53: such an integer is its own shortest
/// digits, since the digits of any shorter decimal that read back as it would be another
/// integer, at least 1 away.
fn small_integer(magnitude: f64) -> Option<u64> {
    (magnitude < 9_007_199_254_740_992.0 && magnitude.fract() == 0.0).then_some(magnitude as u64)
}

/// `value` in decimal digits.
fn write_decimal(mut value: u64, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn number(bits: u64) -> String {
        let mut out = Vec::new();
        write_number(f64::from_bits(bits), &mut out);
        String::from_utf8(out).unwrap()
    }

    /// RFC 8785 Appendix B: IEEE 754 doubles and their canonical text.
    #[test]
    fn numbers_as_ecmascript_writes_them() {
        for (bits, text) in [
            (0x0000_0000_0000_0000, "0"),
            (0x8000_0000_0000_0000, "0"),
            (0x0000_0000_0000_0001, "5e-324"),
            (0x8000_0000_0000_0001, "-5e-324"),
            (0x7fef_ffff_ffff_ffff, "1.7976931348623157e+308"),
            (0xffef_ffff_ffff_ffff, "-1.7976931348623157e+308"),
            (0x4340_0000_0000_0000, "9007199254740992"),
            (0xc340_0000_0000_0000, "-9007199254740992"),
            (0x4430_0000_0000_0000, "295147905179352830000"),
            (0x44b5_2d02_c7e1_4af5, "9.999999999999997e+22"),
            (0x44b5_2d02_c7e1_4af6, "1e+23"),
            (0x44b5_2d02_c7e1_4af7, "1.0000000000000001e+23"),
            (0x444b_1ae4_d6e2_ef4e, "999999999999999700000"),
            (0x444b_1ae4_d6e2_ef4f, "999999999999999900000"),
            (0x444b_1ae4_d6e2_ef50, "1e+21"),
            (0x3eb0_c6f7_a0b5_ed8c, "9.999999999999997e-7"),
            (0x3eb0_c6f7_a0b5_ed8d, "0.000001"),
            (0x41b3_de43_5555_5553, "333333333.3333332"),
            (0x41b3_de43_5555_5554, "333333333.33333325"),
            (0x41b3_de43_5555_5555, "333333333.3333333"),
            (0x41b3_de43_5555_5556, "333333333.3333334"),
            (0x41b3_de43_5555_5557, "333333333.33333343"),
            (0xbecb_f647_612f_3696, "-0.0000033333333333333333"),
            // Two shortest digit strings equally near (…117.2 and …117.3 for …117.25):
            // ECMAScript takes the even one, as V8 writes it.
            (
                (2_291_324_119_468_469_f64 / 4.0).to_bits(),
                "572831029867117.2",
            ),
            (
                (-2_291_324_119_468_469_f64 / 4.0).to_bits(),
                "-572831029867117.2",
            ),
        ] {
            assert_eq!(number(bits), text, "{bits:#018x}");
        }
    }

    /// Integers below 2^53 are written from their digits; 2^53 and past, and fractions, as
    /// any other double.
    #[test]
    fn small_integers_are_their_digits() {
        assert_eq!(small_integer(1.0), Some(1));
        assert_eq!(small_integer(1250.0), Some(1250));
        assert_eq!(
            small_integer(9_007_199_254_740_991.0),
            Some(9_007_199_254_740_991)
        );
        assert_eq!(small_integer(9_007_199_254_740_992.0), None);
        assert_eq!(small_integer(1e300), None);
        assert_eq!(small_integer(0.5), None);
        assert_eq!(small_integer(2.5), None);
        assert_eq!(small_integer(f64::INFINITY), None);
    }

    /// The number writer as it was before ryu-js, through `String`s (Rust's shortest
    /// round-trip digits placed as ECMAScript places them): what ryu-js must write, so that no
    /// fingerprint changes.
    fn reference(value: f64) -> String {
        if value == 0.0 {
            return "0".into();
        }
        let sign = if value < 0.0 { "-" } else { "" };
        let scientific = format!("{:e}", value.abs());
        let (mantissa, exponent) = scientific.split_once('e').unwrap();
        let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
        let (k, n) = (digits.len() as i64, exponent.parse::<i64>().unwrap() + 1);
        let body = if k <= n && n <= 21 {
            format!("{digits}{}", "0".repeat((n - k) as usize))
        } else if 0 < n && n <= 21 {
            format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
        } else if -6 < n && n <= 0 {
            format!("0.{}{digits}", "0".repeat((-n) as usize))
        } else {
            let rest = if k > 1 {
                format!(".{}", &digits[1..])
            } else {
                String::new()
            };
            let sign = if n > 0 { '+' } else { '-' };
            format!("{}{rest}e{sign}{}", &digits[..1], (n - 1).abs())
        };
        format!("{sign}{body}")
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(4096))]
        /// Every finite double, and every integer a double holds exactly, is written as the
        /// reference writes it, but where two shortest digit strings are equally near the
        /// double: there the reference took either, and ECMAScript takes the one whose last
        /// digit is even (Number::toString, step 5). Both read back as the double, with as
        /// many digits.
        #[test]
        fn numbers_are_written_as_the_reference_writes_them(
            bits in proptest::num::u64::ANY,
            integer in -(1i64 << 53)..=(1i64 << 53),
            shift in 0u32..64,
        ) {
            for value in [
                f64::from_bits(bits),
                integer as f64,
                (integer >> (shift % 54)) as f64,
                integer as f64 * 2f64.powi(shift as i32),
                integer as f64 / 2f64.powi(shift as i32),
            ] {
                if !value.is_finite() {
                    continue;
                }
                let mut out = Vec::new();
                write_number(value, &mut out);
                let ours = String::from_utf8(out).unwrap();
                let old = reference(value);
                if ours != old {
                    proptest::prop_assert_eq!(ours.len(), old.len());
                    proptest::prop_assert_eq!(ours.parse::<f64>().unwrap(), value);
                    proptest::prop_assert_eq!(old.parse::<f64>().unwrap(), value);
                    let last = |text: &str| {
                        let digits = text.split('e').next().unwrap_or_default();
                        digits.bytes().rfind(u8::is_ascii_digit).unwrap_or_default()
                    };
                    proptest::prop_assert_eq!(last(&ours) % 2, 0, "{} against {}", ours, old);
                    proptest::prop_assert_eq!(last(&ours).abs_diff(last(&old)), 1);
                }
            }
        }
    }
}
