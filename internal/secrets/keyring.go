package secrets

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// KeySize is the size of a server key: AES-256.
const KeySize = 32

// KeyFileName is the key file generated under the data dir when the
// server is given none.
const KeyFileName = "secrets.key"

// KeyEnv is the environment variable that may hold the keys, in the key
// file's format, in place of a file.
const KeyEnv = "SHEEPFOLD_SECRETS_KEYS"

var keyIDPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,32}$`)

// Keyring is the server's keys: each has an id, the last one seals, every
// one opens. It is read-only once made, safe for concurrent use.
type Keyring struct {
	ids   []string
	aeads map[string]cipher.AEAD
}

// ErrOpen reports a sealed value that no key opens: a wrong or missing
// key, or a value moved to another row or changed.
var ErrOpen = errors.New("secrets: the sealed value does not open with the server's keys")

// ParseKeys reads keys in the key file's format: one key a line,
// "ID:BASE64" (32 bytes, standard base64), blank lines and lines starting
// with # ignored. The last key seals new values; every key opens.
func ParseKeys(text string) (*Keyring, error) {
	k := &Keyring{aeads: map[string]cipher.AEAD{}}
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, b64, ok := strings.Cut(line, ":")
		if !ok || !keyIDPattern.MatchString(id) {
			return nil, fmt.Errorf("line %d: want ID:BASE64 with an ID of letters, digits, _ . - (at most 32)", n)
		}
		raw, err := base64.StdEncoding.DecodeString(b64)
		if err != nil || len(raw) != KeySize {
			return nil, fmt.Errorf("line %d: key %q is not %d bytes of base64", n, id, KeySize)
		}
		if k.aeads[id] != nil {
			return nil, fmt.Errorf("line %d: key id %q twice", n, id)
		}
		block, err := aes.NewCipher(raw)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		k.ids = append(k.ids, id)
		k.aeads[id] = aead
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(k.ids) == 0 {
		return nil, errors.New("no key")
	}
	return k, nil
}

// NewKeyLine returns a key file line with a new random key named id.
func NewKeyLine(id string) (string, error) {
	if !keyIDPattern.MatchString(id) {
		return "", fmt.Errorf("key id %q: letters, digits, _ . - (at most 32)", id)
	}
	var b [KeySize]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return id + ":" + base64.StdEncoding.EncodeToString(b[:]) + "\n", nil
}

// LoadKeys returns the server's keys: from file when it is not "", else
// from $SHEEPFOLD_SECRETS_KEYS when set, else from dataDir/secrets.key,
// which is made (0600, one new key) when it does not exist. A key file
// anyone but its owner may read is refused.
func LoadKeys(file, dataDir string) (*Keyring, error) {
	if file == "" {
		if env := os.Getenv(KeyEnv); env != "" {
			k, err := ParseKeys(env)
			if err != nil {
				return nil, fmt.Errorf("$%s: %w", KeyEnv, err)
			}
			return k, nil
		}
		file = filepath.Join(dataDir, KeyFileName)
		line, err := NewKeyLine("k" + time.Now().UTC().Format("20060102"))
		if err != nil {
			return nil, err
		}
		f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			_, err = f.WriteString(line)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(file)
				return nil, fmt.Errorf("secrets key file: %w", err)
			}
		} else if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("secrets key file: %w", err)
		}
	}
	fi, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("secrets key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("secrets key file %s: mode %v lets others read it; chmod 600 it", file, fi.Mode().Perm())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("secrets key file: %w", err)
	}
	k, err := ParseKeys(string(b))
	if err != nil {
		return nil, fmt.Errorf("secrets key file %s: %w", file, err)
	}
	return k, nil
}

// Current is the id of the key that seals.
func (k *Keyring) Current() string { return k.ids[len(k.ids)-1] }

// IDs are the keys' ids, the sealing one last.
func (k *Keyring) IDs() []string { return append([]string(nil), k.ids...) }

// additional binds a sealed value to its row: a value sealed for one
// account, name and version does not open as another's.
func additional(owner, name string, version int64) []byte {
	return fmt.Appendf(nil, "sheepfold-secret\x00%s\x00%s\x00%d", owner, name, version)
}

// Seal encrypts value for the row (owner, name, version) under the
// current key and returns the key id and the nonce followed by the
// ciphertext. Each value gets a random nonce.
func (k *Keyring) Seal(owner, name string, version int64, value []byte) (string, []byte, error) {
	id := k.Current()
	aead := k.aeads[id]
	out := make([]byte, aead.NonceSize(), aead.NonceSize()+len(value)+aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		return "", nil, err
	}
	return id, aead.Seal(out, out, value, additional(owner, name, version)), nil
}

// Open decrypts what Seal made for the same row; ErrOpen when the key is
// unknown or the value does not open for this row.
func (k *Keyring) Open(keyID, owner, name string, version int64, sealed []byte) ([]byte, error) {
	aead := k.aeads[keyID]
	if aead == nil {
		return nil, fmt.Errorf("%w: key %q is not among the server's keys", ErrOpen, keyID)
	}
	if len(sealed) < aead.NonceSize() {
		return nil, ErrOpen
	}
	v, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], additional(owner, name, version))
	if err != nil {
		return nil, ErrOpen
	}
	return v, nil
}
