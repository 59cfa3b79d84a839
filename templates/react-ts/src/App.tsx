export default function App() {
  return <h1>Hello from react-ts</h1>
}
